"""The node agent's snapshot step (nodewarm/bootstrap/snapshot/take.py): which container of the check pod it dumps,
the context it records in every key, snapshots removed when that context changes, and a real checkpoint of a
running container (runc + the CRIU setup builds) that the handler then restores. Whatever fails, the step says why
and never raises: the node's Warm is the engine check's.

The agent's whole path, as the node against the real API server, is in test_snapshot_agent_step.py; on a real
node with vLLM, tests/realnode/test_snapshot_agent.py."""

from __future__ import annotations

import pytest

from nodewarm.api import snapshot as contract
from nodewarm.bootstrap.compilecache.restore import RestoreResult
from nodewarm.bootstrap.snapshot import key as snapkey
from nodewarm.bootstrap.snapshot import take
from nodewarm.bootstrap.snapshot.store import Store
from support.runcbox import create_and_start


def _pod(*statuses) -> dict:
    return {"metadata": {"name": "p"}, "status": {"containerStatuses": list(statuses)}}


def _status(name="vllm", cid="containerd://abc123", state=("running",)) -> dict:
    return {"name": name, "containerID": cid, "state": {s: {} for s in state}}


def test_the_dumped_container_is_the_check_pods_running_serving_container():
    pod = _pod(_status("engine-check", "containerd://runner", ("terminated",)), _status())
    assert take.container_id(pod) == ("abc123", "")


@pytest.mark.parametrize("pod, why", [
    (None, "pod is gone"),
    (_pod(_status("engine-check")), "has no vllm container: is spec.serving.snapshot rendered"),
    (_pod(_status(state=("terminated",))), "not running (terminated)"),
    (_pod(_status(cid="docker://abc")), "runs under 'docker', not containerd"),
    (_pod(_status(cid="")), "not containerd"),
])
def test_without_a_running_containerd_serving_container_there_is_nothing_to_dump(pod, why):
    cid, said = take.container_id(pod)
    assert cid is None and why in said


def test_the_context_names_the_generation_and_the_compile_cache_restored_or_why_not():
    restored = RestoreResult("restored", "Restored", "", envelope_key="s3://b/k", sha256="f00", generation=3)
    cold = RestoreResult("cold", "NoBundle", "")
    assert take.context("g1", restored) == {"generation": "g1", "compileCache": "s3://b/k@3:f00"}
    assert take.context("g1", cold) == {"generation": "g1", "compileCache": "cold:NoBundle"}
    assert take.context("g1", None) == {"generation": "g1", "compileCache": "none"}


def _publish(store: Store, slot: str, context: dict[str, str]) -> None:
    staging = store.stage(slot)
    (staging / "images" / "pages-1.img").write_bytes(b"x")
    key = {"container": "vllm", "context": sorted([k, v] for k, v in context.items())}
    store.publish(staging, slot, key)


def test_a_new_context_removes_every_snapshot_taken_under_another(tmp_path):
    store = Store(tmp_path / "s").open()
    _publish(store, "vllm-aaa", {"generation": "g1", "compileCache": "c1"})
    _publish(store, "vllm-bbb", {"generation": "g2", "compileCache": "c1"})
    assert store.set_context({"generation": "g2", "compileCache": "c1"}) == ["vllm-aaa"]
    assert store.slots() == ["vllm-bbb"] and store.context() == {"generation": "g2", "compileCache": "c1"}
    assert store.set_context({"generation": "g2", "compileCache": "c2"}) == ["vllm-bbb"]
    assert store.slots() == []


def test_an_unreadable_context_is_empty_and_a_key_names_the_context_part_that_differs(tmp_path):
    store = Store(tmp_path / "s").open()
    (store.root / contract.CONTEXT_FILE).write_text("{not json")
    assert store.context() == {}
    facts = snapkey.NodeFacts("k", "cpu", "f", "", "runc 1.1", "criu 4.2")
    config = {"process": {"args": ["vllm"]}, "annotations": {snapkey.CONTAINER_NAME_ANNOTATION: "vllm"}}
    a = snapkey.from_bundle(config, (), facts, {"generation": "g1", "compileCache": "c"})
    b = snapkey.from_bundle(config, (), facts, {"generation": "g2", "compileCache": "c"})
    assert a.slot == b.slot, "one model, one slot: a new generation replaces the old snapshot"
    assert snapkey.differences(a.to_dict(), b.to_dict()) == ["context.generation"]


def test_a_running_container_is_checkpointed_under_the_context_and_restored_until_the_context_changes(
        tmp_path, runc, criu):
    settings = take.Settings(store=tmp_path / "store", runc_root=str(runc.root), runc="runc", criu=criu)
    store = Store(settings.store).open()
    c = runc.bundle("vllm")
    assert "no snapshot of this container" in create_and_start(runc, store, criu, c)
    token, _, _ = c.wait_count(5)
    stale = store.root / ".staging-vllm-crash"       # what a crash mid-checkpoint left
    stale.mkdir()

    got = take.take(settings, _pod(_status(cid=f"containerd://{c.id}")), {"generation": "g1", "compileCache": "c"})

    assert got.taken and got.reason == contract.TAKEN, got.message
    assert got.image_bytes > 0 and got.slot in got.message and not stale.exists()
    assert runc.status(c.id) != "running", "the checkpoint ends the check's engine"
    b = runc.bundle("vllm")
    assert "restored from the snapshot" in create_and_start(runc, store, criu, b)
    assert b.wait_count(1)[0] == token, "the restored process is the checkpointed one"

    # A new generation on this node: the agent records it before its next snapshot, and the old one is gone.
    again = take.take(settings, None, {"generation": "g2", "compileCache": "c"})
    assert not again.taken and again.removed == (got.slot,) and "pod is gone" in again.message
    assert "no snapshot of this container" in create_and_start(runc, store, criu, runc.bundle("vllm"))


def test_a_node_without_criu_takes_no_snapshot_and_says_why(tmp_path, runc, criu):
    settings = take.Settings(store=tmp_path / "store", runc_root=str(runc.root), runc="runc",
                             criu=str(tmp_path / "no-criu"))
    store = Store(settings.store).open()
    c = runc.bundle("vllm")
    create_and_start(runc, store, criu, c)
    c.wait_count(2)
    got = take.take(settings, _pod(_status(cid=f"containerd://{c.id}")), {"generation": "g1"})
    assert not got.taken and got.reason == contract.NOT_TAKEN and "CRIU" in got.message, got.message
    assert runc.status(c.id) == "running", "a snapshot not taken leaves the check's engine alone"
    assert store.slots() == []


def test_a_check_pod_that_cannot_be_read_takes_no_snapshot_and_says_why(tmp_path):
    class Refusing:      # stands for an API client whose request fails (the kubernetes client's calls go through it)
        def __getattr__(self, name):
            raise ConnectionError("connection refused\n  to the API server")

    settings = take.Settings(store=tmp_path / "store", runc_root=str(tmp_path), runc="runc", criu="criu")
    got = take.take_for_request(settings, Refusing(), "node-1", "default", "llm", "r1", {"generation": "g1"})
    assert (got.taken, got.reason) == (False, contract.NOT_TAKEN)
    assert got.message == ("no snapshot: cannot read the check pod: ConnectionError: connection refused to the API "
                           "server"), got.message
    assert not (tmp_path / "store").exists(), "nothing is written when the pod cannot be read"
