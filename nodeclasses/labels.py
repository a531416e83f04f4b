"""Names nodewarm puts on cluster objects. One place, because the controller, the renderer, the
bootstrap and the tests must agree on them."""

MANAGED_BY = "app.kubernetes.io/managed-by"
PROFILE_LABEL = "nodewarm.io/profile"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
WARM_CONDITION = "nodewarm.io/Warm"
GPU_TAINT = "nvidia.com/gpu"
FIELD_MANAGER = "nodewarm"
