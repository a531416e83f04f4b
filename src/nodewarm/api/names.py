"""Names nodewarm puts on cluster objects. One place, because the controller, the renderer, the
bootstrap and the tests must agree on them."""

MANAGED_BY = "app.kubernetes.io/managed-by"
PROFILE_LABEL = "nodewarm.io/profile"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"   # well-known; Karpenter sets it
GPU_TAINT = "nvidia.com/gpu"
FIELD_MANAGER = "nodewarm"

# Written by the node agent on its own Node (NodeRestriction allows conditions and these annotations).
WARM_CONDITION = "nodewarm.io/Warm"
CACHE_ANNOTATION = "nodewarm.io/compile-cache"
CACHE_REASON_ANNOTATION = "nodewarm.io/compile-cache-reason"
TIMELINE_ANNOTATION = "nodewarm.io/timeline"
WEIGHTS_ANNOTATION = "nodewarm.io/weights"
# Set by the node agent when the launcher failed before it started (what failed, when): see
# nodewarm/bootstrap/launchrecord.py.
LAUNCH_FAILURE_ANNOTATION = "nodewarm.io/launch-failure"
# The serving image pre-pull's outcome (nodewarm/bootstrap/imageprepull.py), recorded by the node agent on its own Node.
IMAGE_ANNOTATION = "nodewarm.io/image-prepull"
# The generation the agent warmed, recorded on a node still under the startup taint: the controller turns it
# into the generation label in the write that lifts the taint (nodewarm/bootstrap/nodestatus.py says why).
WARM_GENERATION_ANNOTATION = "nodewarm.io/warm-generation"
# Whether the Node advertised the GPUs the vLLM pod requests before Warm (nodewarm/bootstrap/gpuwait.py), by the
# node agent.
GPUS_ANNOTATION = "nodewarm.io/gpus"
# serving.snapshot: whether the node agent took a snapshot of the check's engine, and why not (JSON: taken, reason,
# message, slot, seconds, bytes), by the node agent (nodewarm/bootstrap/snapshot/take.py).
SNAPSHOT_ANNOTATION = "nodewarm.io/snapshot"
# The weights' in-flight progress, written by the node agent while it pulls (nodewarm/bootstrap/agent.py
# LiveProgress) and read by `nodewarm status`: JSON {"doneBytes", "totalBytes", "mbps", "at"}.
PROGRESS_ANNOTATION = "nodewarm.io/weights-progress"

# Many models per node (nodewarm/api/models.py, docs/models.md). The node agent reports every model it holds or
# pulls in MODELS_ANNOTATION (JSON, api.models.HeldModel); the controller alone turns it into one label per further
# model, MODEL_LABEL_PREFIX + "<profile>-<name>" = the generation held verified, which that model's Deployment requires.
MODELS_ANNOTATION = "nodewarm.io/models"
MODEL_LABEL_PREFIX = "models.nodewarm.io/"

# Written by the controller on a Node: its record of the node's lifecycle (views.WarmState), and the label
# of the generation the node serves (set as it lifts the taint; the vLLM pods select it, nodewarm/api/generation.py).
STATE_ANNOTATION = "nodewarm.io/state"
GENERATION_LABEL = "nodewarm.io/generation"
CACHE_LABEL = "nodewarm.io/compile-cache"
# What that label may say; anything else a node reports is recorded as "unknown".
CACHE_OUTCOMES = ("hit", "miss", "cold")
# Also set as it lifts the taint, for `kubectl get nodes -L`: the model served, and warm=true (or cold, lifted at the
# deadline: the node's copy is incomplete).
MODEL_LABEL = "nodewarm.io/model"
WARM_LABEL = "nodewarm.io/warm"
# On a WarmProfile, by the controller: the finalizer that holds a deleted profile until its startup taint is out of
# the NodePool, and the condition that says why that clean-up waits (nodewarm/controller/warmprofile/cleanup.py;
# `nodewarm status` shows a held profile's nodes by them).
CLEANUP_FINALIZER = "nodewarm.io/cleanup"
CLEANUP_CONDITION = "Cleanup"

# The controller's ServiceAccount (its Deployment and RBAC, nodewarm/controller/manifests.py) and the namespace it is
# installed in unless told otherwise (the Helm chart's release namespace; `nodewarm render --controller-namespace`):
# a profile's engine check binds a Role in the serving namespace to it (nodewarm/nodeclasses/enginecheck.py).
CONTROLLER_NAME = "nodewarm-controller"
CONTROLLER_NAMESPACE = "nodewarm"

# Peers before S3 (docs/peers.md). The node agent writes PEER_ANNOTATION on its own Node: JSON {"profile",
# "endpoint" ("<InternalIP>:<port>"), "model" (api.generation.model_key), "state" (pulling|warm), "files", "bytes",
# "at", "also" (the other models it serves: {model key: state})}; other agents of the profile find it with a watch
# and read parts from it before S3. The controller mints
# the profile's key Secret (data: PEER_KEY_CURRENT, PEER_KEY_PREVIOUS, 32 random bytes each) in
# spec.bootstrap.namespace and lets each of the profile's nodes read it by a RoleBinding to system:node:<name>,
# deleted when the node goes.
PEER_ANNOTATION = "nodewarm.io/peer"
PEER_KEY_CURRENT, PEER_KEY_PREVIOUS = "current", "previous"
PEER_KEY_ROTATED_ANNOTATION = "nodewarm.io/peer-key-rotated-at"


def peer_secret_name(profile: str) -> str:
    return f"nodewarm-peers-{profile}"


def peer_binding_name(profile: str, node: str) -> str:
    """The RoleBinding that lets one node read its profile's peer key (one per node, so it goes with the node)."""
    return f"nodewarm-peers-{profile}-{node}"[:253]
