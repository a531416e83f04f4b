"""The NodeClaim scene the controller's plan tests (tests/controller/nodeclaim/test_controller_plan.py) and the
views' tests (tests/api/test_views.py) share."""

from __future__ import annotations

from functools import partial

from support import builders
from support.builders import TAINT

T0 = 1_800_000_000.0
GPU = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
OTHER = {"key": "example.com/other", "value": "x", "effect": "NoExecute"}


# The scene: claim c1 registered at T0, its node n1 (the guards name its uid) with foreign taints around ours,
# warm 30 s later.
claim_obj = partial(builders.nodeclaim, "c1", created=T0 - 70, launched=T0 - 60, registered=T0,
                    provider_id="aws:///z/i-1")
node_obj = partial(builders.node, "n1", uid="u-n1", created=T0, provider_id="aws:///z/i-1", taints=(GPU, TAINT, OTHER),
                   warm="True", warm_at=T0 + 30)
