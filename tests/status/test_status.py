"""`nodewarm status`: the pure part over realistic NodeClaims, Nodes, WarmProfiles and Events (one per phase),
the agent's in-flight progress that feeds its WEIGHTS column, and the command end to end against the real API
server with a read-only identity (list only: it proves the command needs no write access)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import pytest

from nodewarm.api import names as labels
from nodewarm.api.timeutil import fmt_duration
from nodewarm.status.cli import RBAC_RULES
from nodewarm.status.explain import explain
from nodewarm.status.observed import Observed
from nodewarm.status.rows import rows
from nodewarm.status.text import format_explanation, format_rows, held_notes
from nodewarm.bootstrap import agent
from nodewarm.bootstrap.modelcache import warmer
from nodewarm.bootstrap.weights import progress as wprogress
from support.builders import condition, node, nodeclaim, v
from nodewarm.api.errors import NodewarmError

NOW = datetime(2026, 12, 1, 6, 0, 0, tzinfo=timezone.utc).timestamp()
POOL, PROFILE = "gpu-p5", "qwen3-35b"
GB = 1_000_000_000


def ts(ago: float, ms: bool = False) -> str:
    d = datetime.fromtimestamp(NOW - ago, timezone.utc)
    return d.isoformat(timespec="milliseconds").replace("+00:00", "Z") if ms else d.strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(seconds: float) -> float:
    return NOW - seconds


def cond(t: str, s: str, reason: str, seconds_ago: float, message: str = "") -> dict:
    return condition(t, s, reason, ago(seconds_ago), message)


def tl(**ago) -> str:
    return json.dumps({k: ts(v, ms=True) for k, v in ago.items()}, separators=(",", ":"))


def progress_ann(done: int, total: int, ago: float = 10, mbps: float = 2000.0) -> str:
    return json.dumps({"doneBytes": done, "totalBytes": total, "mbps": mbps, "at": ts(ago, ms=True)})


def state_ann(decision: str, decided_ago: float, registered_ago: float, warm_ago: float | None = None) -> str:
    return json.dumps({"profile": PROFILE, "nodeClaim": "x", "decision": decision, "registered": ts(registered_ago),
                       "warm": ts(warm_ago) if warm_ago is not None else None, "decided": ts(decided_ago),
                       "conditions": []})


def warming_pair():
    """Registered 7m48s ago (deadline 20m: 12m12s left); 43% of 60 GB pulled; cache restored, the image pre-pull
    and the GPU wait still running."""
    c = nodeclaim("gpu-p5-warming", created=ago(600), launched=ago(560), registered=ago(468))
    n = node("ip-10-0-1-1.ec2.internal", claim=c, created=ago(470), annotations={
        "nodewarm.io/timeline": tl(agent_started=460, weights_started=459, first_byte=455,
                                   compile_cache_started=459, compile_cache_restored=440, image_prepull_started=459,
                                   gpus_wait_started=459),
        labels.PROGRESS_ANNOTATION: progress_ann(26 * GB, 60 * GB)})
    return c, n


def warm_pair():
    """Warm=True 20s ago, taint still on: the controller has not lifted it yet."""
    c = nodeclaim("gpu-p5-warm", created=ago(900), launched=ago(860), registered=ago(800))
    n = node("ip-10-0-1-2.ec2.internal", claim=c, created=ago(802),
             warm=cond("nodewarm.io/Warm", "True", "WeightsVerified", 20, "14 files verified"), annotations={
        "nodewarm.io/timeline": tl(agent_started=790, weights_started=789, weights_done=25, warm_reported=20),
        "nodewarm.io/weights": json.dumps({"files": 14, "bytes": 60 * GB, "downloadedBytes": 60 * GB, "mbps": 2100}),
        "nodewarm.io/warm-generation": "4f2a9c1e0b7d3a65"})
    return c, n


def serving_pair():
    c = nodeclaim("gpu-p5-serving", created=ago(3600), launched=ago(3560), registered=ago(3500))
    n = node("ip-10-0-1-3.ec2.internal", claim=c, created=ago(3502), taints=(),
                 warm=cond("nodewarm.io/Warm", "True", "WeightsVerified", 3100, "ok"),
                 labels={"nodewarm.io/generation": "4f2a9c1e0b7d3a65", "nodewarm.io/warm": "true"}, annotations={
                     "nodewarm.io/timeline": tl(agent_started=3490, weights_started=3489, weights_done=3101,
                                                warm_reported=3100),
                     "nodewarm.io/weights": json.dumps({"files": 14, "bytes": 60 * GB, "mbps": 2100}),
                     "nodewarm.io/compile-cache": "hit", "nodewarm.io/compile-cache-reason": "Hit",
                     "nodewarm.io/image-prepull": "pulled ImagePresent docker.io/vllm/vllm-openai:v0.21.0",
                     "nodewarm.io/gpus": "advertised GpusAdvertised 8/8",
                     "nodewarm.io/state": state_ann("Untainted", 3099, 3500, 3100)})
    return c, n


def cold_pair():
    """Registered 25m ago, deadline 20m, onDeadline=untaint: lifted cold 5m ago; the pull is still going."""
    c = nodeclaim("gpu-p5-cold", created=ago(1600), launched=ago(1560), registered=ago(1500))
    n = node("ip-10-0-1-4.ec2.internal", claim=c, created=ago(1502), taints=(),
                 labels={"nodewarm.io/warm": "cold", "nodewarm.io/compile-cache": "cold"}, annotations={
                     "nodewarm.io/timeline": tl(agent_started=1490, weights_started=1489),
                     labels.PROGRESS_ANNOTATION: progress_ann(50 * GB, 60 * GB),
                     "nodewarm.io/state": state_ann("DeadlineUntaint", 300, 1500)})
    return c, n


def failed_pair():
    c = nodeclaim("gpu-p5-failed", created=ago(400), launched=ago(370), registered=ago(300))
    n = node("ip-10-0-1-5.ec2.internal", claim=c, created=ago(302), warm=cond(
        "nodewarm.io/Warm", "False", "NotInstanceStore", 280, "weights not ready: /mnt/nvme is on EBS"))
    return c, n


def past_deadline_pair():
    """Registered 21m ago with a 20m deadline; the controller has not acted yet."""
    c = nodeclaim("gpu-p5-late", created=ago(1300), launched=ago(1290), registered=ago(1260))
    n = node("ip-10-0-1-6.ec2.internal", claim=c, created=ago(1262))
    return c, n


def observed(*pairs, profiles=None, events=()):
    claims = [c for c, _ in pairs if c is not None]
    nodes = [n for _, n in pairs if n is not None]
    return Observed(nodes=nodes, claims=claims, profiles=profiles or [v()], events=list(events))


def by_name(rs):
    return {r.name: r for r in rs}


# ------------------------------------------------------------------------------------------------ pure

def test_each_phase_from_realistic_objects():
    launching = (nodeclaim("gpu-p5-aaaaaa", created=ago(40)), None)
    registering = (nodeclaim("gpu-p5-bbbbbb", created=ago(90), launched=ago(30)), None)
    replacing = (nodeclaim("gpu-p5-gone", created=ago(2000), launched=ago(1900), registered=ago(1800),
                           deleting=ago(15)), None)
    obs = observed(launching, registering, warming_pair(), warm_pair(), serving_pair(), cold_pair(), failed_pair(),
                   past_deadline_pair(), replacing)
    rs = by_name(rows(obs, NOW))
    got = {k: (r.phase, fmt_duration(r.in_phase_s), r.reason) for k, r in rs.items()}
    assert got == {
        "nodeclaim/gpu-p5-aaaaaa": ("Launching", "40s", "AwaitingReconciliation"),
        "nodeclaim/gpu-p5-bbbbbb": ("Registering", "30s", "NotRegistered"),
        "ip-10-0-1-1.ec2.internal": ("Warming", "7m48s", "PullingWeights"),
        "ip-10-0-1-2.ec2.internal": ("Warm", "20s", "WeightsVerified"),
        "ip-10-0-1-3.ec2.internal": ("Untainted(serving)", "51m39s", "WeightsVerified"),
        "ip-10-0-1-4.ec2.internal": ("DeadlineUntaint(cold)", "5m", "DeadlineExceeded"),
        "ip-10-0-1-5.ec2.internal": ("Failed", "4m40s", "NotInstanceStore"),
        "ip-10-0-1-6.ec2.internal": ("Warming", "21m", "NoAgentReport"),
        "nodeclaim/gpu-p5-gone": ("Replacing", "15s", "NodeClaimDeleting"),
    }
    warming = rs["ip-10-0-1-1.ec2.internal"]
    assert warming.weights.text() == "26/60 GB 43%" and warming.cache == "restored"
    assert warming.deadline_text() == "12m12s" and warming.node_claim == "gpu-p5-warming"
    assert rs["ip-10-0-1-2.ec2.internal"].weights.text() == "60 GB done"
    assert rs["ip-10-0-1-2.ec2.internal"].generation == "4f2a9c1e0b7d3a65"
    assert rs["ip-10-0-1-2.ec2.internal"].deadline_text() == "-"          # Warm: the deadline no longer runs
    serving = rs["ip-10-0-1-3.ec2.internal"]
    assert (serving.cache, serving.image, serving.gpus, serving.generation) == ("hit", "pulled", "8/8",
                                                                                "4f2a9c1e0b7d3a65")
    assert rs["ip-10-0-1-4.ec2.internal"].weights.text() == "50/60 GB 83%"   # the cold node's pull goes on
    assert rs["ip-10-0-1-4.ec2.internal"].cache == "cold"                    # the controller's label
    assert rs["ip-10-0-1-5.ec2.internal"].deadline_text() == "15m"          # a failed node still has its deadline
    assert rs["ip-10-0-1-6.ec2.internal"].deadline_text() == "passed 1m ago"
    assert rs["nodeclaim/gpu-p5-aaaaaa"].deadline_text() == "-"


def test_keep_decision_and_a_taint_someone_else_removed():
    c, n = past_deadline_pair()
    n["metadata"]["annotations"]["nodewarm.io/state"] = state_ann("DeadlineKeep", 50, 1260)
    c2, n2 = warming_pair()
    n2["spec"]["taints"] = []
    rs = by_name(rows(observed((c, n), (c2, n2), profiles=[v(spec__readiness__onDeadline="keep")]), NOW))
    assert rs["ip-10-0-1-6.ec2.internal"].phase == "DeadlineKeep"
    assert fmt_duration(rs["ip-10-0-1-6.ec2.internal"].in_phase_s) == "50s"
    assert rs["ip-10-0-1-1.ec2.internal"].phase == "Untainted(external)"


def test_warming_reason_is_what_the_agent_is_still_busy_with():
    def reason(**ago):
        c, n = warming_pair()
        n["metadata"]["annotations"]["nodewarm.io/timeline"] = tl(agent_started=460, **ago)
        return rows(observed((c, n)), NOW)[0].reason

    started = dict(weights_started=459, image_prepull_started=459, gpus_wait_started=459, compile_cache_started=459)
    assert reason(**started) == "PullingWeights"
    assert reason(**started, weights_done=10) == "PullingImage"
    assert reason(**started, weights_done=10, image_prepull_done=9) == "WaitingForGPUs"
    assert reason(**started, weights_done=10, image_prepull_ended=9, gpus_advertised=8) == "RestoringCache"
    assert reason(**started, weights_done=10, image_prepull_done=9, gpus_wait_ended=8, compile_cache_cold=7) == "Warming"


def test_a_pool_named_by_two_profiles_shows_the_one_the_controller_binds_it_to():
    # The controller binds a NodePool to the oldest profile naming it and refuses the next (NodePoolTaken), whatever
    # order the API lists them in; status must show that profile's deadline, not the last one listed.
    newer = v(metadata__name="a-newer", spec__readiness__deadline="5m")
    older = v(metadata__name="z-older", spec__readiness__deadline="20m")
    newer["metadata"]["creationTimestamp"], older["metadata"]["creationTimestamp"] = ts(60), ts(3600)
    for listed in ([newer, older], [older, newer]):
        rs = rows(observed(warming_pair(), profiles=listed), NOW)
        assert {r.profile for r in rs} == {"z-older"}
    deleting = dict(older, metadata={**older["metadata"], "deletionTimestamp": ts(1)})
    assert {r.profile for r in rows(observed(warming_pair(), profiles=[newer, deleting]), NOW)} == {"a-newer"}


def held(o: dict, reason: str | None = "WouldDrift", finalizers=(labels.CLEANUP_FINALIZER,)) -> dict:
    """``o`` deleted; with the clean-up finalizer still on it and (``reason``) the controller's Cleanup condition."""
    md = {**o["metadata"], "deletionTimestamp": ts(30), "finalizers": list(finalizers)}
    conds = [cond(labels.CLEANUP_CONDITION, "False", reason, 25, "removing it would drift 1 live NodeClaim(s)")] \
        if reason else []
    return {**o, "metadata": md, "status": {"conditions": conds}}


def test_a_deleted_profile_whose_clean_up_is_held_keeps_its_nodes_as_the_controller_does():
    # The controller (held_profiles / profile_for_pool): a deleted profile still holding its finalizer keeps gating
    # its pool, so its nodes, deadline and taint are still its own; a live profile naming the pool comes first.
    old = v(spec__readiness__deadline="5m")
    old["metadata"]["creationTimestamp"] = ts(3600)
    obs = observed(warming_pair(), profiles=[held(old)])
    rs = rows(obs, NOW)
    assert [(r.profile, r.phase, r.cleanup, r.deadline) for r in rs] == [(PROFILE, "Warming", "WouldDrift", "5m")]
    assert held_notes(rs, obs) == [
        f"WarmProfile {PROFILE} is deleted; its clean-up is held (Cleanup=WouldDrift), so it still gates NodePool "
        f"{POOL}: removing it would drift 1 live NodeClaim(s)"]
    x = explain(obs, "ip-10-0-1-1.ec2.internal", NOW)
    assert "clean-up held: WouldDrift" in format_explanation(x) and held_notes(rs, obs)[0] in x.notes
    assert rows(observed(warming_pair(), profiles=[held(old, reason=None)]), NOW)[0].cleanup == "Pending"
    assert rows(observed(warming_pair(), profiles=[held(old, finalizers=())]), NOW) == []   # nothing held
    newer = v(metadata__name="a-newer")
    newer["metadata"]["creationTimestamp"] = ts(60)
    assert [(r.profile, r.cleanup) for r in rows(observed(warming_pair(), profiles=[held(old), newer]),
                                                        NOW)] == [("a-newer", "")]


def test_profile_filter_and_nodes_outside_any_profile_are_left_out():
    other = v(metadata__name="llama", spec__nodes__nodePool="gpu-p4d", spec__nodes__nodeClass="gpu-p4d")
    c, n = warm_pair()
    foreign_c = nodeclaim("cpu-pool-x", created=ago(100), launched=ago(90), registered=ago(80), pool="cpu-pool")
    foreign_n = node("ip-10-0-9-9.ec2.internal", claim=foreign_c, created=ago(80), taints=())
    lc = nodeclaim("gpu-p4d-abc", created=ago(100), launched=ago(90), registered=ago(80), pool="gpu-p4d")
    ln = node("ip-10-0-2-2.ec2.internal", claim=lc, created=ago(80))
    obs = observed((c, n), (foreign_c, foreign_n), (lc, ln), profiles=[v(), other])
    assert [r.name for r in rows(obs, NOW)] == ["ip-10-0-2-2.ec2.internal", "ip-10-0-1-2.ec2.internal"]
    assert [r.name for r in rows(obs, NOW, profile="llama")] == ["ip-10-0-2-2.ec2.internal"]


def test_a_node_without_its_claim_is_still_shown():
    c, n = warming_pair()
    rs = rows(observed((None, n)), NOW)
    assert [(r.name, r.phase, r.node_claim) for r in rs] == [("ip-10-0-1-1.ec2.internal", "Warming", "")]
    # Without the claim's Registered time the deadline counts from the Node's creation (as the controller does).
    assert rs[0].deadline_text() == "12m10s"


def test_table_and_wide_columns():
    obs = observed(warming_pair(), serving_pair())
    out = format_rows(rows(obs, NOW))
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PROFILE", "PHASE", "FOR", "WEIGHTS", "CACHE", "REASON", "DEADLINE"]
    assert lines[1].split() == ["ip-10-0-1-1.ec2.internal", PROFILE, "Warming", "7m48s", "26/60", "GB", "43%",
                                "restored", "PullingWeights", "12m12s"]
    wide = format_rows(rows(obs, NOW), wide=True).splitlines()
    assert wide[0].split()[-5:] == ["NODECLAIM", "INSTANCE-TYPE", "GENERATION", "IMAGE", "GPUS"]
    assert wide[2].split()[-5:] == ["gpu-p5-serving", "p5.48xlarge", "4f2a9c1e0b7d3a65", "pulled", "8/8"]
    assert wide[1].split()[-5:] == ["gpu-p5-warming", "p5.48xlarge", "-", "-", "8"]   # allocatable, no annotation


def test_json_rows_are_machine_readable():
    d = [r.to_dict() for r in rows(observed(warming_pair()), NOW)]
    json.dumps(d)
    assert d[0]["phase"] == "Warming" and d[0]["weights"]["done"] == 26 * GB
    assert d[0]["weights"]["total"] == 60 * GB and round(d[0]["weights"]["percent"]) == 43
    assert round(d[0]["deadline_left_s"]) == 732 and d[0]["name"] == "ip-10-0-1-1.ec2.internal"


def test_explain_a_warming_node():
    c, n = warming_pair()
    events = [{"metadata": {"name": "e1", "namespace": "default"}, "involvedObject": {"kind": "NodeClaim",
               "name": c["metadata"]["name"]}, "reason": "Launched", "message": "Status condition transitioned",
               "type": "Normal", "lastTimestamp": ts(560), "count": 1},
              {"metadata": {"name": "e2"}, "involvedObject": {"kind": "Node", "name": n["metadata"]["name"]},
               "reason": "Registered", "message": "Status condition transitioned", "type": "Normal",
               "lastTimestamp": ts(468)},
              {"metadata": {"name": "e3"}, "involvedObject": {"kind": "Node", "name": "another"},
               "reason": "X", "message": "", "type": "Normal", "lastTimestamp": ts(1)}]
    x = explain(observed((c, n), warm_pair(), events=events), n["metadata"]["name"], NOW)
    assert x.waits_for == ["weights 43% (26/60 GB, 2000 MB/s, ~17s left, reported 10s ago)",
                           "image pre-pull (the kubelet pulling the serving image)",
                           "GPUs not advertised: device plugin (the Node's allocatable nvidia.com/gpu)",
                           "deadline in 12m12s then untaint (cold)"]
    steps = {s.what: s for s in x.steps}
    assert steps["restore compile cache"].outcome == "compile_cache_restored"
    assert steps["pull weights"].outcome == "running" and steps["pull weights"].end is None
    assert steps["register node"].outcome == "Registered"
    assert [e.reason for e in x.events] == ["Launched", "Registered"]
    text = format_explanation(x)
    assert "Phase:       Warming for 7m48s" in text and "- weights 43% (26/60 GB" in text
    assert "restore compile cache" in text and "NodeClaim/gpu-p5-warming" in text
    d = json.loads(json.dumps(x.to_dict()))             # -o json
    assert d["row"]["phase"] == "Warming" and d["waitsFor"] == x.waits_for and len(d["events"]) == 2
    # By its NodeClaim's name too.
    assert explain(observed((c, n)), "gpu-p5-warming", NOW).row.node == n["metadata"]["name"]
    assert explain(observed((c, n)), "nope", NOW) is None


def test_explain_other_phases_say_what_they_wait_for():
    def waits(pair, **kw):
        return explain(observed(pair, **kw), (pair[1] or pair[0])["metadata"]["name"], NOW).waits_for

    assert waits(warm_pair()) == ["the controller to lift the startup taint (the node reported Warm)"]
    assert waits(serving_pair())[0].startswith("nothing from nodewarm")
    assert waits(cold_pair())[0].startswith("the node's weights copy to complete")
    assert waits(failed_pair(), profiles=[v(spec__readiness__onDeadline="replace")]) == [
        "nothing: the agent reported Warm=False (NotInstanceStore: weights not ready: /mnt/nvme is on EBS)",
        "deadline in 15m then replace the node"]
    assert waits(past_deadline_pair())[-1] == "deadline passed 1m ago: the controller will untaint (cold)"
    assert waits((nodeclaim("gpu-p5-aaaaaa", created=ago(40)), None))[0].startswith(
        "Karpenter to launch the instance")
    c, n = past_deadline_pair()                 # no timeline yet: an agent that has not written anything
    assert waits((c, n))[0].startswith("the node agent to report")
    c, n = warming_pair()                       # the pull started, no byte count yet
    del n["metadata"]["annotations"][labels.PROGRESS_ANNOTATION]
    assert waits((c, n))[0] == "weights (listing, checking capacity or pulling: no byte count reported yet)"


def engine_pair(annotation: str | None, warm: dict | None = None, **timeline_ago):
    """A node whose weights, cache, image and GPUs are done, with the agent's engine-check annotation."""
    from nodewarm.api import enginecheck

    c = nodeclaim("gpu-p5-engine", created=ago(700), launched=ago(660), registered=ago(600))
    ann = {"nodewarm.io/timeline": tl(agent_started=590, weights_started=589, weights_done=200,
                                      compile_cache_started=589, compile_cache_restored=580, **timeline_ago)}
    if annotation is not None:
        ann[enginecheck.REQUEST_ANNOTATION] = annotation
    return c, node("ip-10-0-1-9.ec2.internal", claim=c, created=ago(602), warm=warm, annotations=ann)


def test_the_engine_check_running_passed_and_failed():
    from nodewarm.api import enginecheck

    req = enginecheck.Request("r1", ts(60, ms=True))
    running = engine_pair(req.to_json(), engine_check_requested=60)
    r = rows(observed(running), NOW)[0]
    assert (r.phase, r.reason, r.engine) == ("Warming", "CheckingEngine", "running")
    x = explain(observed(running), "ip-10-0-1-9.ec2.internal", NOW)
    assert x.engine == f"running (requested {req.at}, request r1)"
    assert any(w.startswith("the engine check: vLLM booting on this node") and "qwen3-35b-engine-check" in w
               for w in x.waits_for)
    assert {s.what: s.outcome for s in x.steps}["engine check"] == "running"
    assert "Engine:      running" in format_explanation(x)

    passed = enginecheck.Outcome("r1", "passed", "EngineServed", "served", boot_s=41.25, first_token_s=0.48,
                                 compile_cache="hit")
    done = engine_pair(passed.to_json(), warm=cond("nodewarm.io/Warm", "True", "EngineServed", 5, "vLLM served"),
                       engine_check_requested=60, engine_started=58, engine_ready=17, engine_first_token=16,
                       engine_check_passed=15, warm_reported=5)
    r = rows(observed(done), NOW)[0]
    assert r.engine == "passed (boot 41.2s, first token 0.5s)"
    x = explain(observed(done), "ip-10-0-1-9.ec2.internal", NOW)
    assert x.engine == "passed (EngineServed): vLLM booted in 41.2s, first token 0.5s after ready, compile cache hit"
    step = {s.what: s for s in x.steps}["engine check"]
    assert step.outcome == "engine_check_passed" and step.end - step.start == pytest.approx(45)
    wide = format_rows([r], wide=True).splitlines()
    assert wide[0].split()[8] == "ENGINE" and "passed (boot 41.2s, first token 0.5s)" in wide[1]

    failed = enginecheck.Outcome("r1", "failed", "CompileCacheNotLoaded", "vLLM compiled again",
                                 compile_cache="miss", log_tail=tuple(f"line {i}" for i in range(9)))
    bad = engine_pair(failed.to_json(), warm=cond("nodewarm.io/Warm", "False", "CompileCacheNotLoaded", 5,
                                                  "vLLM compiled again"), engine_check_requested=60,
                      engine_check_failed=6)
    r = rows(observed(bad), NOW)[0]
    assert (r.phase, r.reason, r.engine) == ("Failed", "CompileCacheNotLoaded", "failed: CompileCacheNotLoaded")
    x = explain(observed(bad), "ip-10-0-1-9.ec2.internal", NOW)
    assert x.engine == "failed (CompileCacheNotLoaded): vLLM compiled again, compile cache miss"
    assert "engine check, the engine's last lines: line 4 | line 5 | line 6 | line 7 | line 8" in x.notes
    assert json.loads(json.dumps(x.to_dict()))["engine"] == x.engine

    # No check asked for, or an annotation nobody can read: nothing shown, nothing broken.
    for ann in (None, "{not json"):
        r = rows(observed(engine_pair(ann)), NOW)[0]
        assert r.engine == "-" and r.reason == "Warming"
        assert explain(observed(engine_pair(ann)), "ip-10-0-1-9.ec2.internal", NOW).engine == ""


def test_odd_annotations_do_not_break_the_table():
    c, n = warming_pair()
    n["metadata"]["annotations"].update({"nodewarm.io/timeline": "{not json", labels.PROGRESS_ANNOTATION: "[]",
                                         "nodewarm.io/state": "null"})
    bad_profile = v(spec__readiness__deadline="soon")
    r = rows(observed((c, n), profiles=[bad_profile]), NOW)[0]
    assert (r.phase, r.weights.text(), r.deadline_text()) == ("Warming", "-", "-")


def test_names_match_their_owners_and_the_module_stays_light():
    import subprocess
    import sys

    from nodewarm.api import views
    from nodewarm.api.names import GENERATION_LABEL
    from nodewarm.controller.nodeclaim import plan, untaint
    from nodewarm.status import rows as status_rows

    # One name each, from nodewarm.api.names, for the controller that writes it and the status that reads it (the
    # record through the views both read it with).
    assert views.STATE_ANNOTATION is plan.STATE_ANNOTATION and status_rows.GENERATION_LABEL is GENERATION_LABEL
    assert status_rows.CACHE_LABEL is untaint.CACHE_LABEL
    assert status_rows.PROGRESS_ANNOTATION == labels.PROGRESS_ANNOTATION  # one name: the agent writes it from there
    # `nodewarm --help` imports every command's module: this one must not pull in boto3 or the controller.
    heavy = ("boto", "nodewarm.controller", "nodewarm.profile")
    code = f"import sys, nodewarm.status.cli; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_teaches_with_examples(capsys):
    from nodewarm.cli import main

    with pytest.raises(SystemExit):
        main(["status", "--help"])
    out = capsys.readouterr().out
    assert "nodewarm status --profile qwen3-35b -o wide" in out and "list" in out


# ------------------------------------------------------------------------------------------------ agent progress

def test_progress_tells_its_listener_from_the_context_it_was_made_in():
    heard = []
    clock = [0.0]
    with wprogress.listening(lambda phase, s: heard.append((phase, s.done, s.total))):
        p = wprogress.Progress("download", 100, interval_s=0.01, clock=lambda: clock[0])
    outside = wprogress.Progress("download", 100, interval_s=0.01)
    with p, outside:
        p.add(40)
        clock[0] = 1.0
        time.sleep(0.1)
    assert heard and heard[-1] == ("download", 40, 100)      # the final snapshot, on exit
    assert all(h[0] == "download" for h in heard)
    assert outside._listener is None                          # made outside the block: hears nothing


def test_progress_listener_failure_does_not_stop_the_pull():
    def boom(phase, s):
        raise RuntimeError("listener bug")

    with wprogress.listening(boom):
        p = wprogress.Progress("download", 10, interval_s=0.01)
    with p:
        p.add(10)
        time.sleep(0.05)
    assert p.snapshot().done == 10


def test_live_progress_writes_when_something_changed_and_stops_on_refusal():
    written = []
    live = agent.LiveProgress(written.append, interval_s=3600)
    assert live.flush() is False                              # nothing to say yet
    live.timeline = {"agent_started": "2026-12-01T06:00:00.000Z"}
    assert live.flush() is True and live.flush() is False     # unchanged: no second write
    live.on_progress("download", wprogress.Snapshot(26 * GB, 60 * GB, 13.0, 2e9))
    live.on_progress("other", wprogress.Snapshot(1, 1, 1.0, 1.0))
    assert live.flush() is True
    p = json.loads(written[-1][labels.PROGRESS_ANNOTATION])
    assert (p["doneBytes"], p["totalBytes"], p["mbps"]) == (26 * GB, 60 * GB, 2000.0)
    assert json.loads(written[-1]["nodewarm.io/timeline"]) == live.timeline
    assert all(k.startswith("nodewarm.io/") for w in written for k in w)

    def refused(ann):
        raise NodewarmError("403", "NodeStatusForbidden")

    live2 = agent.LiveProgress(refused, interval_s=0.01)
    live2.timeline = {"agent_started": "x"}
    live2.start()
    time.sleep(0.1)
    assert not live2._thread.is_alive()                       # a refused write ends the writes
    live2.stop()


def test_agent_wires_the_pull_progress_and_its_timeline_into_live_progress(monkeypatch, tmp_path):
    """warm() binds its timeline and the pull's Progress (made in the weights thread) to LiveProgress; run()
    stops it before the final report."""
    from nodewarm.bootstrap.weights import WeightsSummary

    def fake_warm_weights(cfg):
        with wprogress.Progress("download", 60, interval_s=0.01) as p:
            p.add(26)
            time.sleep(0.05)
        return WeightsSummary(ok=True, reason="WeightsVerified", message="", uri=cfg.uri, dest=str(cfg.dest), files=1,
                              bytes=60, downloaded_bytes=60)

    monkeypatch.setattr(warmer, "warm_weights", fake_warm_weights)
    written, lock = [], threading.Lock()

    def write(ann):
        with lock:
            written.append(dict(ann))

    live = agent.LiveProgress(write, interval_s=3600)
    cfg = agent.AgentConfig(profile="m", model_uri="s3://b/m/", dest=tmp_path / "m", mount=tmp_path,
                            node_name="n")
    result = agent.warm(cfg, live=live)
    assert result.warm, result.message
    assert live.timeline is not None and "weights_done" in live.timeline
    assert live.flush()
    p = json.loads(written[-1][labels.PROGRESS_ANNOTATION])
    assert (p["doneBytes"], p["totalBytes"]) == (26, 60)


# ------------------------------------------------------------------------------------------------ real API server

def _read_only_kubeconfig(kube, admin_k, tmp_path):
    """A ServiceAccount bound to a ClusterRole with RBAC_RULES (list only; events in `default` by a Role)."""
    from support.rbac import apply_replacing

    from support.controller_fixtures import uniq

    ns = uniq("status")
    cluster_rules = [r for r in RBAC_RULES if r["resources"] != ["events"]]
    events_rules = [r for r in RBAC_RULES if r["resources"] == ["events"]]
    sa = {"kind": "ServiceAccount", "name": "viewer", "namespace": ns}
    apply_replacing(admin_k, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-viewer"},
         "rules": cluster_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{ns}-viewer"}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-viewer"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"{ns}-events", "namespace": "default"}, "rules": events_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{ns}-events", "namespace": "default"}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{ns}-events"}},
    ])
    token = kube.service_account_token(ns, "viewer")
    return kube.write_kubeconfig(tmp_path / "kubeconfig-viewer", token, "viewer"), token


@pytest.mark.kube
def test_status_against_the_real_api_server_read_only(kube, admin, k, tmp_path, capsys, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from nodewarm.bootstrap.nodestatus import report_progress, report_warm
    from nodewarm.cli import main
    from nodewarm.controller.kube import NODES, Kube
    from nodewarm_dev.testenv.karpenter import KarpenterSim

    from support.controller_fixtures import events_for, installed, running, taint_keys, uniq, wait_for

    names = {"warming": "node-6", "warm": "node-7"}      # kubelet identities in the server's tokens.csv
    for n in names.values():
        try:
            k.delete(NODES, n)
            k.merge_patch(NODES, n, {"metadata": {"finalizers": None}})
        except ApiException:
            pass
    sim = KarpenterSim(admin)
    plain = uniq("plain-node")        # a Node of no WarmProfile's NodePool: never listed (label selector)
    k.create(NODES, {"metadata": {"name": plain, "labels": {"karpenter.sh/nodepool": "someone-elses"}}})
    with installed(k, inject_ready=True, deadline="1m", on_deadline="untaint") as inst, running(admin):
        warming = sim.scale_up(inst.pool, node_name=names["warming"])
        warm = sim.scale_up(inst.pool, node_name=names["warm"])
        late = sim.scale_up(inst.pool, registered_ago_s=90)      # a minute's deadline, registered 90s ago
        names["late"] = late.node
        pending = sim.create_nodeclaim(inst.pool)["metadata"]["name"]
        # The warming node's agent, with its own kubelet identity, as LiveProgress writes it.
        as_node = kube.api_client(kube.node_token(names["warming"]))
        def real(ago: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - ago))

        report_progress(as_node, names["warming"], {
            "nodewarm.io/timeline": json.dumps({"agent_started": real(5), "weights_started": real(5)}),
            labels.PROGRESS_ANNOTATION: json.dumps({"doneBytes": 26 * GB, "totalBytes": 60 * GB, "mbps": 2000.0,
                                                    "at": real(0)})})
        # Another node's identity may not write it (NodeRestriction).
        with pytest.raises(NodewarmError):
            report_progress(as_node, names["warm"], {labels.PROGRESS_ANNOTATION: "{}"})
        report_warm(kube.api_client(kube.node_token(names["warm"])), names["warm"], True, "WeightsVerified", "ok",
                    {"nodewarm.io/compile-cache": "cold", "nodewarm.io/compile-cache-reason": "NoBundle"})
        wait_for(lambda: inst.profile.readiness.taint_key not in taint_keys(k, names["warm"]), what="warm lifted")
        wait_for(lambda: inst.profile.readiness.taint_key not in taint_keys(k, names["late"]), what="late lifted")
        wait_for(lambda: events_for(k, "Node", names["late"]), what="the deadline's event")

        kubeconfig, token = _read_only_kubeconfig(kube, k, tmp_path)
        viewer = Kube(kube.api_client(token))
        with pytest.raises(ApiException) as e:                    # the identity really is read-only
            viewer.merge_patch(NODES, names["warm"], {"metadata": {"annotations": {"x": "y"}}})
        assert e.value.status == 403

        capsys.readouterr()
        assert main(["status", "--kubeconfig", str(kubeconfig), "--profile", inst.name]) == 0
        out = capsys.readouterr().out
        lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
        assert out.splitlines()[0].split()[:3] == ["NAME", "PROFILE", "PHASE"]
        w = lines[names["warming"]]
        assert w[2] == "Warming" and w[4:7] == ["26/60", "GB", "43%"], out
        assert w[-1].endswith("s") and w[-1] != "-"               # deadline left, out of 1m
        assert lines[names["warm"]][2] == "Untainted(serving)" and lines[names["warm"]][5] == "cold", out
        assert lines[names["late"]][2] == "DeadlineUntaint(cold)", out
        assert lines[f"nodeclaim/{pending}"][2] == "Launching", out
        assert plain not in out and len(lines) == 4, out

        assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "wide", "--profile", inst.name]) == 0
        wide = capsys.readouterr().out
        assert "NODECLAIM" in wide and warm.claim in wide and "p5.48xlarge" in wide

        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))         # $KUBECONFIG, as kubectl reads it
        assert main(["status", "-o", "json", "--profile", inst.name]) == 0
        monkeypatch.delenv("KUBECONFIG")
        items = {i["name"]: i for i in json.loads(capsys.readouterr().out)["items"]}
        assert items[names["warming"]]["weights"]["done"] == 26 * GB
        assert items[names["late"]]["phase"] == "DeadlineUntaint(cold)"

        assert main(["status", "--kubeconfig", str(kubeconfig), names["late"]]) == 0
        one = capsys.readouterr().out
        assert "Phase:       DeadlineUntaint(cold)" in one
        assert "WarmDeadlineUntaint" in one and f"NodeClaim/{late.claim}" in one and f"Node/{names['late']}" in one
        assert "register node" in one and "controller: DeadlineUntaint" in one

        assert main(["status", "--kubeconfig", str(kubeconfig), names["warming"]]) == 0
        one = capsys.readouterr().out
        assert "- weights 43% (26/60 GB" in one and "deadline in" in one and "pull weights" in one
        assert warming.claim in one

        assert main(["status", "--kubeconfig", str(kubeconfig), "no-such-node"]) == 1
        assert main(["status", "--kubeconfig", str(kubeconfig), "--profile", "no-such-profile"]) == 1
        assert "no WarmProfile named no-such-profile" in capsys.readouterr().err
    k.delete(NODES, plain)


@pytest.mark.kube
def test_status_shows_a_deleted_profile_whose_clean_up_is_held_and_its_nodes(kube, admin, k, tmp_path, capsys):
    """Deleting a WarmProfile while its pool has live NodeClaims holds the clean-up (removing the startup taint
    would drift them): the terminating profile still gates the pool, and `status` (read-only) shows its node under
    it with the clean-up's reason and what finishing it costs."""
    from nodewarm.cli import main
    from nodewarm.controller.kube import WARMPROFILES
    from nodewarm_dev.testenv.karpenter import KarpenterSim

    from support.controller_fixtures import installed, running, wait_for
    from support.controller_fixtures import cleanup_condition, wait_reason

    sim = KarpenterSim(admin)
    with installed(k, user_data=None, user_startup_taints=()) as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        n = sim.scale_up(inst.pool)
        k.delete(WARMPROFILES, inst.name)
        wait_for(lambda: cleanup_condition(k, inst.name), what="the clean-up held")
        kubeconfig, _ = _read_only_kubeconfig(kube, k, tmp_path)

        capsys.readouterr()
        assert main(["status", "--kubeconfig", str(kubeconfig)]) == 0
        out = capsys.readouterr().out
        row = next(line.split() for line in out.splitlines() if line.startswith(n.node))
        assert row[1:3] == [inst.name, "Warming"], out
        assert f"WarmProfile {inst.name} is deleted; its clean-up is held (Cleanup=WouldDrift)" in out, out
        assert "would drift 1 live NodeClaim(s)" in out and "spec.injection.onLive: drift" in out, out

        assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "json", "--profile", inst.name]) == 0
        items = json.loads(capsys.readouterr().out)["items"]
        assert [(i["name"], i["profile"], i["cleanup"]) for i in items] == [(n.node, inst.name, "WouldDrift")]

        assert main(["status", "--kubeconfig", str(kubeconfig), n.node]) == 0
        assert "clean-up held: WouldDrift" in capsys.readouterr().out



def test_a_node_warm_before_registration_shows_registering_and_why():
    c, n = warm_pair()
    c = nodeclaim("gpu-p5-warm", created=ago(900), launched=ago(860))         # Registered still Unknown
    n["spec"]["taints"].append({"key": "karpenter.sh/unregistered", "effect": "NoExecute"})
    x = explain(observed((c, n)), n["metadata"]["name"], NOW)
    assert (x.row.phase, x.row.reason) == ("Registering", "WarmBeforeRegistration")
    assert x.row.deadline_left_s is None            # the deadline counts from registration
    assert x.waits_for[0].startswith("Karpenter to register the node (the node reported Warm, but the Node still "
                                     "carries karpenter.sh/unregistered")


def test_a_lifted_taint_put_back_is_never_shown_serving_and_is_explained():
    c, n = warm_pair()
    n["metadata"]["annotations"][labels.STATE_ANNOTATION] = state_ann("Untainted", 10, 800, 20)
    x = explain(observed((c, n)), n["metadata"]["name"], NOW)
    assert (x.row.phase, x.row.reason) == ("Warm", "TaintReAdded")
    assert x.waits_for[0].startswith("the controller to lift the startup taint again (nodewarm.io/warming is back")
    assert any(note.startswith("the startup taint is back: nodewarm lifted it at") for note in x.notes), x.notes
    n["spec"]["taints"] = [t for t in n["spec"]["taints"] if t["key"] != "nodewarm.io/warming"]
    assert explain(observed((c, n)), n["metadata"]["name"], NOW).row.phase == "Untainted(serving)"
