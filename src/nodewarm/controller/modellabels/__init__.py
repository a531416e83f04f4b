"""The model labels of a profile's further models (spec.models) on its Nodes: plan (pure) and the reconciler."""
