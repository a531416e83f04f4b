"""The NodeClaim reconciler (controller.py) and its phases, one module each: track, untaint, deadline, budget."""
