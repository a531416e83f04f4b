"""The node agent's timeline: when each step of the warm-up started and ended on this node.

The agent records these keys in the Node annotation ``names.TIMELINE_ANNOTATION`` (RFC 3339 times); the
controller times register→warm by ``WARM_REPORTED``, ``nodewarm status`` shows where a node stands and what it
waits for, and the demo draws them. The values are the wire format: renaming one breaks every Node already
annotated, so a key is added, never renamed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Timeline(StrEnum):
    LAUNCH_STARTED = "launch_started"         # the launcher began (AL2023 host unit), before the agent
    LAUNCH_FAILED = "launch_failed"           # the launcher failed before the agent started (launchrecord)
    AGENT_STARTED = "agent_started"
    AGENT_FAILED = "agent_failed"
    WEIGHTS_STARTED = "weights_started"
    FIRST_BYTE = "first_byte"                 # the weights' first byte arrived
    WEIGHTS_DONE = "weights_done"
    WEIGHTS_FAILED = "weights_failed"
    COMPILE_CACHE_STARTED = "compile_cache_started"
    COMPILE_CACHE_RESTORED = "compile_cache_restored"
    COMPILE_CACHE_COLD = "compile_cache_cold"  # no bundle for this node's key: vLLM will compile
    IMAGE_PREPULL_STARTED = "image_prepull_started"
    IMAGE_PREPULL_DONE = "image_prepull_done"
    IMAGE_PREPULL_ENDED = "image_prepull_ended"  # ended without the image (timeout, no runtime socket, ...)
    GPUS_WAIT_STARTED = "gpus_wait_started"
    GPUS_ADVERTISED = "gpus_advertised"
    GPUS_WAIT_ENDED = "gpus_wait_ended"          # ended without the GPUs advertised
    # readiness.engineCheck (nodewarm.api.enginecheck): asked for once the steps above ended; vLLM's process start,
    # its /health answering and the first completion back are the runner's clock readings on this node.
    ENGINE_CHECK_REQUESTED = "engine_check_requested"
    ENGINE_STARTED = "engine_started"
    ENGINE_READY = "engine_ready"
    ENGINE_FIRST_TOKEN = "engine_first_token"
    ENGINE_CHECK_PASSED = "engine_check_passed"
    ENGINE_CHECK_FAILED = "engine_check_failed"
    # serving.snapshot (nodewarm.api.snapshot): the agent checkpoints the check's engine once it passed.
    SNAPSHOT_STARTED = "snapshot_started"
    SNAPSHOT_TAKEN = "snapshot_taken"
    SNAPSHOT_NOT_TAKEN = "snapshot_not_taken"
    WARM_REPORTED = "warm_reported"              # sub-second: the controller times register_to_warm by it


class Step(NamedTuple):
    """One step of the agent's warm-up: what it is called, the key that starts it, the keys that can end it."""
    what: str
    start: Timeline
    ends: tuple[Timeline, ...]


# In the order the agent runs them; a step that started and has not ended is what a warming node waits on.
AGENT_STEPS: tuple[Step, ...] = (
    Step("node agent", Timeline.AGENT_STARTED, (Timeline.WARM_REPORTED, Timeline.AGENT_FAILED)),
    Step("pull weights", Timeline.WEIGHTS_STARTED, (Timeline.WEIGHTS_DONE, Timeline.WEIGHTS_FAILED)),
    Step("restore compile cache", Timeline.COMPILE_CACHE_STARTED,
         (Timeline.COMPILE_CACHE_RESTORED, Timeline.COMPILE_CACHE_COLD)),
    Step("pre-pull serving image", Timeline.IMAGE_PREPULL_STARTED,
         (Timeline.IMAGE_PREPULL_DONE, Timeline.IMAGE_PREPULL_ENDED)),
    Step("wait for GPUs advertised", Timeline.GPUS_WAIT_STARTED, (Timeline.GPUS_ADVERTISED, Timeline.GPUS_WAIT_ENDED)),
    Step("engine check", Timeline.ENGINE_CHECK_REQUESTED, (Timeline.ENGINE_CHECK_PASSED, Timeline.ENGINE_CHECK_FAILED)),
    Step("snapshot engine", Timeline.SNAPSHOT_STARTED, (Timeline.SNAPSHOT_TAKEN, Timeline.SNAPSHOT_NOT_TAKEN)),
)
