"""The production NodePool (pure): disruption and limits that keep warm GPUs and bound spend, capacity types and
reservations, what of it drifts (the static hash and Karpenter's dynamic checks), the GPU-memory fit check and
the image pre-pull timeout against the readiness deadline. Every refusal names the field, the values and the fix."""

from __future__ import annotations

import copy

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.api.errors import ProfileError
from nodewarm.karpenter import drift, driftpreview
from nodewarm.nodeclasses import crdvalidate, ec2nodeclass, nodepool
from nodewarm.nodeclasses import inject as desired
from nodewarm.nodeclasses.render import render
from support import crds as crdsupport
from support.builders import v

RESERVED = ["cr-0123456789abcdef0"]


def checked(doc) -> tuple[WarmProfile, dict]:
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def docs_of(doc) -> list[dict]:
    p, types = checked(doc)
    return render(p, types).documents


def kind(docs, k):
    (d,) = [x for x in docs if x["kind"] == k]
    return d


def pool_of(doc) -> dict:
    return kind(docs_of(doc), "NodePool")


def reqs(pool) -> dict[str, dict]:
    return {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}


def refused(doc) -> ProfileError:
    with pytest.raises(ProfileError) as e:
        checked(doc)
    return e.value


# --- disruption and limits -------------------------------------------------------------------------------------

def test_the_rendered_pool_keeps_warm_gpus_and_bounds_the_gpus():
    pool = pool_of(v())
    assert pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m",
                                          "budgets": [{"nodes": "1"}]}
    # One replica + one node of surge, 8 GPUs each (p5.48xlarge).
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "16"}


@pytest.mark.parametrize("replicas, types, tp, gpus", [
    (1, ["p5.48xlarge"], 2, 16),                    # (1 + 1) x 8
    (4, ["p5.48xlarge"], 2, 40),                    # (4 + 1) x 8
    (8, ["p5.48xlarge"], 2, 80),                    # (8 + 2: the Deployment's 25% surge) x 8
    (3, ["g6e.12xlarge", "p5.48xlarge"], 4, 32),    # the largest allowed type's GPUs: (3 + 1) x 8
])
def test_the_default_gpu_limit_is_replicas_plus_surge_on_the_largest_type(replicas, types, tp, gpus):
    pool = pool_of(v(spec__serving__replicas=replicas, spec__nodes__instanceTypes=types,
                     spec__serving__tensorParallelSize=tp))
    assert pool["spec"]["limits"]["nvidia.com/gpu"] == str(gpus)


def test_the_profile_sets_disruption_and_limits_as_given():
    budgets = [{"nodes": "0", "reasons": ["Drifted"], "schedule": "0 9 * * mon-fri", "duration": "8h"},
               {"nodes": "20%"}]
    pool = pool_of(v(spec__nodes__disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                              "consolidateAfter": "1h", "budgets": budgets},
                     spec__nodes__limits={"gpus": 0, "cpu": "1000", "memory": "4Ti"}))
    assert pool["spec"]["disruption"] == {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                          "consolidateAfter": "1h", "budgets": budgets}
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "0", "cpu": "1000", "memory": "4Ti"}


def test_render_without_types_looks_them_up_offline():
    p, types = checked(v())
    assert nodepool.render(p) == nodepool.render(p, types)


# --- capacity types and reservations -----------------------------------------------------------------------------

def test_no_capacity_types_means_no_requirement_karpenters_default():
    r = reqs(pool_of(v()))
    assert nodepool.CAPACITY_TYPE_LABEL not in r and nodepool.RESERVATION_ID_LABEL not in r
    assert "capacityReservationSelectorTerms" not in kind(docs_of(v()), "EC2NodeClass")["spec"]


def test_capacity_types_become_a_requirement():
    r = reqs(pool_of(v(spec__nodes__capacityTypes=["spot", "on-demand"])))
    assert r[nodepool.CAPACITY_TYPE_LABEL] == {"key": "karpenter.sh/capacity-type", "operator": "In",
                                              "values": ["spot", "on-demand"]}


def test_reservations_select_the_ids_on_the_class_and_pin_only_a_reserved_only_pool():
    docs = docs_of(v(spec__nodes__capacityTypes=["reserved"], spec__nodes__capacityReservationIds=RESERVED))
    assert kind(docs, "EC2NodeClass")["spec"]["capacityReservationSelectorTerms"] == [{"id": RESERVED[0]}]
    assert reqs(kind(docs, "NodePool"))[nodepool.RESERVATION_ID_LABEL] == {
        "key": "karpenter.k8s.aws/capacity-reservation-id", "operator": "In", "values": RESERVED}
    # With on-demand beside reserved the pin would forbid the fallback (the label is only on reserved nodes).
    docs = docs_of(v(spec__nodes__capacityTypes=["reserved", "on-demand"], spec__nodes__capacityReservationIds=RESERVED))
    assert kind(docs, "EC2NodeClass")["spec"]["capacityReservationSelectorTerms"] == [{"id": RESERVED[0]}]
    assert nodepool.RESERVATION_ID_LABEL not in reqs(kind(docs, "NodePool"))


@pytest.mark.parametrize("doc, field, words", [
    (v(spec__nodes__capacityReservationIds=RESERVED), "spec.nodes.capacityTypes", ["reserved", "[reserved, on-demand]"]),
    (v(spec__nodes__capacityTypes=["on-demand"], spec__nodes__capacityReservationIds=RESERVED),
     "spec.nodes.capacityTypes", ["capacityReservationIds", "reserved"]),
    (v("automode", spec__nodes__capacityTypes=["reserved"], spec__nodes__capacityReservationIds=RESERVED),
     "spec.nodes.capacityReservationIds", ["Karpenter mode only"]),
    (v(spec__nodes__disruption={"budgets": [{"nodes": "150%"}]}), "spec.nodes.disruption.budgets[0].nodes",
     ["percentage up to 100%"]),
    (v(spec__nodes__disruption={"budgets": [{"nodes": "1", "schedule": "@daily"}]}),
     "spec.nodes.disruption.budgets[0].duration", ["schedule and duration go together"]),
    (v(spec__nodes__disruption={"budgets": [{"nodes": "1"}, {"nodes": "0", "duration": "1h"}]}),
     "spec.nodes.disruption.budgets[1].schedule", ["set both or neither"]),
    (v(spec__nodes__disruption={"budgets": [{"nodes": "1", "schedule": "@daily", "duration": "30m1h"}]}),
     "spec.nodes.disruption.budgets[0].duration", ["1h30m"]),
])
def test_nodepool_settings_that_cannot_work_are_refused_naming_field_and_fix(doc, field, words):
    e = refused(doc)
    assert e.field == field, str(e)
    for w in words:
        assert w in str(e)


def test_everything_rendered_passes_the_crds_in_force_strictly():
    crds = crdsupport.strict_crds()
    doc = v(spec__nodes__capacityTypes=["reserved"], spec__nodes__capacityReservationIds=RESERVED,
            spec__nodes__limits={"cpu": "1000", "memory": "4Ti"},
            spec__nodes__disruption={"consolidateAfter": "Never", "budgets": [
                {"nodes": "0", "reasons": ["Drifted", "Underutilized"], "schedule": "0 9 * * mon-fri", "duration": "8h"},
                {"nodes": "100%", "reasons": ["Empty"]}]})
    node_docs = [d for d in docs_of(doc) if d["kind"] in ("NodePool", "EC2NodeClass")]
    assert crdvalidate.validate(node_docs, crds) == {}


# --- drift -------------------------------------------------------------------------------------------------------

NODEPOOL_CHANGES = {
    "disruption": dict(spec__nodes__disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                                "consolidateAfter": "Never", "budgets": [{"nodes": "10%"}]}),
    "limits": dict(spec__nodes__limits={"gpus": 64, "cpu": "2000", "memory": "8Ti"}),
    "replicas (the default GPU limit)": dict(spec__serving__replicas=6),
    "capacity types": dict(spec__nodes__capacityTypes=["on-demand", "spot"]),
    "reservations": dict(spec__nodes__capacityTypes=["reserved"], spec__nodes__capacityReservationIds=RESERVED),
}


@pytest.mark.parametrize("change", NODEPOOL_CHANGES)
def test_no_nodepool_addition_is_in_the_drift_hash(change):
    before, after = pool_of(v()), pool_of(v(**NODEPOOL_CHANGES[change]))
    assert before["spec"] != after["spec"]                   # the change reached the object ...
    assert not drift.would_drift(before, after)              # ... and Karpenter's static hash does not see it
    # The model is not blind: a template field Karpenter hashes does drift.
    tainted = copy.deepcopy(after)
    tainted["spec"]["template"]["spec"]["startupTaints"].append({"key": "example.com/x", "effect": "NoSchedule"})
    assert drift.would_drift(after, tainted)


def test_pre_step13_pool_to_this_render_is_not_a_static_drift():
    """A pool rendered before disruption/limits/capacity types existed, re-applied with all of them."""
    old = pool_of(v())
    for k in ("disruption", "limits"):
        del old["spec"][k]
    new = pool_of(v(**NODEPOOL_CHANGES["reservations"]))
    assert not drift.would_drift(old, new)


ON_DEMAND_NODE = {"karpenter.sh/capacity-type": "on-demand", "node.kubernetes.io/instance-type": "p5.48xlarge",
                  "karpenter.k8s.aws/instance-local-nvme": "30400", "nodewarm.io/generation": "g1"}
RESERVED_NODE = {**ON_DEMAND_NODE, "karpenter.sh/capacity-type": "reserved",
                 "karpenter.k8s.aws/capacity-reservation-id": RESERVED[0]}


def test_requirement_changes_drift_dynamically_when_live_nodes_no_longer_match():
    """Outside the static hash, but Karpenter's areRequirementsDrifted replaces a NodeClaim whose labels the new
    requirements reject: narrowing capacity types to reserved replaces the running on-demand nodes."""
    assert not drift.requirements_drifted(pool_of(v()), ON_DEMAND_NODE)
    both = pool_of(v(spec__nodes__capacityTypes=["reserved", "on-demand"], spec__nodes__capacityReservationIds=RESERVED))
    assert not drift.requirements_drifted(both, ON_DEMAND_NODE)
    assert not drift.requirements_drifted(both, RESERVED_NODE)
    only = pool_of(v(spec__nodes__capacityTypes=["reserved"], spec__nodes__capacityReservationIds=RESERVED))
    assert drift.requirements_drifted(only, ON_DEMAND_NODE)
    assert not drift.requirements_drifted(only, RESERVED_NODE)
    other = {**RESERVED_NODE, "karpenter.k8s.aws/capacity-reservation-id": "cr-0fff"}
    assert drift.requirements_drifted(only, other)
    # A node without the generation label (launched before the pool had the requirement) is drifted too.
    assert drift.requirements_drifted(pool_of(v()), {k: x for k, x in ON_DEMAND_NODE.items()
                                                     if k != "nodewarm.io/generation"})


def test_reservations_on_the_ec2nodeclass_are_not_hashed_but_dropping_one_replaces_its_nodes():
    plain = kind(docs_of(v()), "EC2NodeClass")
    with_cr = kind(docs_of(v(spec__nodes__capacityTypes=["reserved", "on-demand"],
                             spec__nodes__capacityReservationIds=RESERVED)), "EC2NodeClass")
    changed = kind(docs_of(v(spec__nodes__capacityTypes=["reserved", "on-demand"],
                             spec__nodes__capacityReservationIds=["cr-0fff"])), "EC2NodeClass")
    # hash:"ignore" (ec2nodeclass.go): adding, changing or removing the terms is no NodeClassDrift ...
    assert not drift.would_drift(plain, with_cr) and not drift.would_drift(with_cr, changed)
    assert not drift.would_drift(with_cr, plain)
    # ... but isCapacityReservationDrifted replaces nodes running in a reservation the class no longer selects.
    assert ec2nodeclass.reservations_dropped(plain, with_cr) == set()          # adding: nothing replaced
    assert ec2nodeclass.reservations_dropped(with_cr, changed) == set(RESERVED)
    assert ec2nodeclass.reservations_dropped(with_cr, plain) == set(RESERVED)


# --- a user's own NodePool ---------------------------------------------------------------------------------------

def test_injection_never_writes_disruption_or_limits_into_a_users_pool():
    p, _ = checked(v())
    body = desired.desired_nodepool_fields(p, {"spec": {"disruption": {"consolidateAfter": "0s"},
                                                        "limits": {"cpu": "10"}}})
    assert set(body["spec"]) == {"template"}


@pytest.mark.parametrize("disruption, warned", [
    (None, True),                                                                 # Karpenter's defaults
    ({"consolidateAfter": "0s"}, True),                                           # policy defaults to ...Underutilized
    ({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5m"}, True),
    ({"consolidationPolicy": "Balanced", "consolidateAfter": "9m59s"}, True),
    ({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "10m"}, False),
    ({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1h30m"}, False),
    ({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "Never"}, False),
    ({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"}, False),
])
def test_a_users_pool_that_consolidates_warm_nodes_soon_is_warned_about(disruption, warned):
    p, _ = checked(v())
    pool = {"spec": {"disruption": disruption}} if disruption is not None else {"spec": {}}
    advice = desired.disruption_advice(p, pool)
    assert bool(advice) == warned
    if warned:
        assert "gpu-p5" in advice and "WhenEmpty" in advice and "consolidateAfter" in advice


def test_the_rendered_pool_is_not_warned_about():
    p, _ = checked(v())
    assert desired.disruption_advice(p, pool_of(v())) is None


# --- GPU memory ----------------------------------------------------------------------------------------------------

def test_weights_that_cannot_fit_one_gpu_are_refused_with_the_numbers_and_the_tp_that_fits():
    e = refused(v(spec__model__sizeGB=140, spec__serving__tensorParallelSize=1))
    assert e.field == "spec.serving.tensorParallelSize" and e.value == 1
    msg = str(e)
    for w in ("140 GB of weights at TP=1", "130.4 GiB) per GPU", "p5.48xlarge's H100 has 80 GiB",
              "72.0 GiB usable at gpu-memory-utilization 0.9", "minus 4 GiB", "use TP >= 2"):
        assert w in msg, msg


def test_the_fit_check_uses_pp_and_the_users_gpu_memory_utilization():
    checked(v(spec__model__sizeGB=140, spec__serving__tensorParallelSize=1,
              spec__serving__extraArgs=["--pipeline-parallel-size", "2"]))
    checked(v(spec__model__sizeGB=140, spec__serving__tensorParallelSize=1, spec__serving__extraArgs=["-pp=2"]))
    e = refused(v(spec__model__sizeGB=140, spec__serving__tensorParallelSize=2,
                  spec__serving__extraArgs=["--gpu_memory_utilization=0.5"]))
    assert e.field == "spec.serving.tensorParallelSize" and "use TP >= 4" in str(e) and "0.5" in str(e)


def test_when_no_tp_fits_the_type_is_named():
    # 8 x A10G (22 GiB): 400 GB is 50 GB a GPU even at TP=8 (it fits the H100s).
    e = refused(v(spec__model__sizeGB=400, spec__serving__tensorParallelSize=8,
                  spec__nodes__instanceTypes=["p5.48xlarge", "g5.48xlarge"]))
    assert e.field == "spec.nodes.instanceTypes[1]" and e.value == "g5.48xlarge"
    assert "A10G" in str(e) and "no tensorParallelSize" in str(e)


@pytest.mark.parametrize("size, tp, types", [
    (67, 2, ["p5.48xlarge"]),            # the base profile and the examples
    (140, 2, ["p5.48xlarge"]),           # 70 GB a GPU: tight, but vLLM starts (H100 80 GiB)
    (140, 8, ["p5.48xlarge"]),
    (67, 4, ["g6e.12xlarge"]),
    (16, 1, ["g5.xlarge"]),              # an 8B model in bf16 on one A10G
])
def test_models_that_fit_pass(size, tp, types):
    checked(v(spec__model__sizeGB=size, spec__serving__tensorParallelSize=tp, spec__nodes__instanceTypes=types))


def test_the_examples_model_and_the_demo_profile_pass():
    # The short profile of docs/operations.md: 67 GB at TP=2 on p5.48xlarge (Karpenter) and p5.48xlarge +
    # p5e.48xlarge (Auto Mode); the examples/ files are checked in tests/test_examples.py.
    checked(v("automode", spec__nodes__instanceTypes=["p5.48xlarge", "p5e.48xlarge"]))
    from nodewarm_dev.demo import run

    run.demo_profile(0.05, "A" * 43 + "=", 2)       # profile.check runs inside


# --- image pre-pull timeout vs the readiness deadline ---------------------------------------------------------------

@pytest.mark.parametrize("timeout, deadline", [("20m", "20m"), ("30m", "20m"), ("90s", "1m"), ("10m", "10m")])
def test_a_prepull_timeout_not_shorter_than_the_deadline_is_refused_naming_both(timeout, deadline):
    e = refused(v(spec__bootstrap__imagePrepullTimeout=timeout, spec__readiness__deadline=deadline))
    assert e.field == "spec.bootstrap.imagePrepullTimeout" and e.value == timeout
    assert f"spec.readiness.deadline ({deadline})" in str(e) and "shorter" in str(e)


@pytest.mark.parametrize("deadline, default", [("1m", "30s"), ("90s", "45s"), ("10m", "5m"), ("15m", "450s"),
                                               ("20m", "10m"), ("2h", "10m")])
def test_the_default_prepull_timeout_follows_a_short_deadline(deadline, default):
    p, _ = checked(v(spec__readiness__deadline=deadline))
    assert p.bootstrap.image_prepull_timeout == default
    assert p.bootstrap.image_prepull_timeout_s < p.readiness.deadline_s


def test_a_prepull_timeout_shorter_than_the_deadline_is_kept():
    p, _ = checked(v(spec__bootstrap__imagePrepullTimeout="19m", spec__readiness__deadline="20m"))
    assert p.bootstrap.image_prepull_timeout_s == 19 * 60


class _FakeKube:
    """Just enough of nodewarm.controller.kube.Kube for the injector: the objects by kind, server-side apply as
    a merge."""

    def __init__(self, *objs):
        self.objs = {(o["kind"], o["metadata"]["name"]): {**o, "metadata": {**o["metadata"], "resourceVersion": "1"}}
                     for o in objs}
        self.applied = []

    def get(self, res, name):
        return copy.deepcopy(self.objs[(res.kind, name)])

    def list(self, res):
        return {"items": [copy.deepcopy(o) for (k, _), o in self.objs.items() if k == res.kind]}

    def apply(self, res, body, force=False):
        self.applied.append(body)
        key = (res.kind, body["metadata"]["name"])
        self.objs[key] = driftpreview.merged(self.objs[key], body)
        return self.objs[key]


@pytest.mark.parametrize("user_disruption, reason", [
    (None, "ConsolidatesWarmNodes"),                             # the CRD's defaults: WhenEmptyOrUnderutilized, 0s
    ({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30m"}, "UpToDate"),
])
def test_the_injector_warns_about_a_users_consolidation_and_leaves_it_alone(user_disruption, reason):
    from nodewarm.controller.warmprofile.inject import Injector

    p, _ = checked(v())
    docs = docs_of(v())
    pool, nodeclass = kind(docs, "NodePool"), kind(docs, "EC2NodeClass")
    del pool["spec"]["limits"]
    del pool["spec"]["disruption"]
    if user_disruption:
        pool["spec"]["disruption"] = user_disruption
    # A user's pool before injection: no startup taint yet.
    pool["spec"]["template"]["spec"]["startupTaints"] = []
    kube = _FakeKube(nodeclass, pool)
    result = Injector(kube).reconcile(p)
    assert (result.condition.status, result.condition.reason) == ("True", reason), result.condition.message
    assert result.warning == (reason != "UpToDate")
    assert [b["kind"] for b in kube.applied] == ["NodePool"]            # the startup taint only
    after = kube.objs[("NodePool", "gpu-p5")]["spec"]
    assert after.get("disruption") == user_disruption and "limits" not in after
    if reason != "UpToDate":
        assert "consolidateAfter 0s" in result.condition.message


def test_tp_times_pp_more_gpus_than_a_node_has_is_refused():
    doc = v(spec__serving__tensorParallelSize=4, spec__serving__extraArgs=["--pipeline-parallel-size=4"])
    with pytest.raises(ProfileError) as e:
        profile.check(profile.from_dict(doc), instancetypes.offline_table())
    assert e.value.field == "spec.serving.extraArgs"
    assert "16 GPUs in one pod, but p5.48xlarge has 8" in str(e.value) and "at most 2" in str(e.value)
    ok = v(spec__serving__tensorParallelSize=4, spec__serving__extraArgs=["-pp", "2"])
    profile.check(profile.from_dict(ok), instancetypes.offline_table())


# --- AMI drift is a choice ---------------------------------------------------------------------------------------

def test_render_refuses_a_karpenter_profile_without_a_pinned_ami_naming_the_field_and_the_fix():
    doc = v(spec__nodes__amiAlias=None)
    p, types = checked(doc)                  # a valid profile: the controller (which injects) needs no alias
    with pytest.raises(ProfileError) as e:
        render(p, types)
    assert e.value.field == "spec.nodes.amiAlias"
    assert "al2023@v20241011" in str(e.value) and "al2023@latest" in str(e.value) and "AMIDrift" in str(e.value)
    assert "amiAlias" not in str(kind(docs_of(v("automode")), "NodeClass"))   # Auto Mode picks its own AMI


@pytest.mark.parametrize("alias, ok", [("al2023@v20241011", True), ("al2023@latest", True),
                                       ("bottlerocket@v1.20.4", True), ("bottlerocket@1.20.4", True),
                                       ("al2023@2024", False), ("al2023@v2024-10-11", False), ("al2@latest", False)])
def test_the_alias_must_be_a_release_karpenter_resolves_or_latest_written_out(alias, ok):
    if ok:
        assert kind(docs_of(v(spec__nodes__amiAlias=alias)), "EC2NodeClass")["spec"]["amiSelectorTerms"] == [
            {"alias": alias}]
    else:
        assert refused(v(spec__nodes__amiAlias=alias)).field == "spec.nodes.amiAlias"


@pytest.mark.parametrize("window, blocked", [
    ({"start": "02:00", "duration": "4h"}, {"schedule": "0 6 * * *", "duration": "20h"}),
    ({"start": "22:30", "duration": "150m"}, {"schedule": "0 1 * * *", "duration": "21h30m"}),
    (None, None),
])
def test_a_drift_pace_renders_budgets_for_reason_drifted(window, blocked):
    pace = {"nodes": "2", **({"window": window} if window else {})}
    budgets = pool_of(v(spec__nodes__disruption={"drift": pace}))["spec"]["disruption"]["budgets"]
    assert budgets[0] == {"nodes": "1"}                                      # the default still caps every reason
    assert budgets[1] == {"nodes": "2", "reasons": ["Drifted"]}
    if blocked:
        # Outside the window, Karpenter's most restrictive active budget for Drifted is 0: no drift replacement.
        assert budgets[2] == {"nodes": "0", "reasons": ["Drifted"], **blocked}
    else:
        assert len(budgets) == 2
    crds = crdsupport.strict_crds()
    assert crdvalidate.validate([pool_of(v(spec__nodes__disruption={"drift": pace}))], crds) == {}


@pytest.mark.parametrize("drift_, field", [
    ({"window": {"start": "02:00", "duration": "24h"}}, "spec.nodes.disruption.drift.window.duration"),
    ({"window": {"start": "25:00", "duration": "4h"}}, "spec.nodes.disruption.drift.window.start"),
    ({"nodes": "101%"}, "spec.nodes.disruption.drift.nodes"),
    ({"window": {"start": "02:00"}}, "spec.nodes.disruption.drift.window"),
])
def test_a_drift_pace_that_cannot_work_is_refused_naming_the_field(drift_, field):
    assert refused(v(spec__nodes__disruption={"drift": drift_})).field == field


def test_a_budget_schedule_that_is_not_cron_is_refused():
    e = refused(v(spec__nodes__disruption={"budgets": [{"nodes": "0", "schedule": "nightly", "duration": "2h"}]}))
    assert e.field == "spec.nodes.disruption.budgets[0].schedule"
