"""The WarmProfile reconciler: its NodeClass and NodePool, its clean-up, its status (controller.py)."""
