"""The WarmProfile reconciler (controller.py) and its phases, one module each: inject, deviceplugins, cleanup; the
status they write (conditions.py)."""
