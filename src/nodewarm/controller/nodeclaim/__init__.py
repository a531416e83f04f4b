"""The NodeClaim reconciler: from a NodeClaim and its Node to one guarded write (controller.py)."""
