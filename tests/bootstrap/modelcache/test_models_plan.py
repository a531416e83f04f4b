"""The agent's plan for a profile's further models (bootstrap/modelcache/plan.py), without servers: the order they
warm in, which folders a pod uses (read from the pods' hostPath volumes, as the API returns them), and what may never
make room for what."""

from __future__ import annotations

from support.builders import v
from nodewarm import profile
from nodewarm.bootstrap.modelcache import plan
from nodewarm.bootstrap.modelcache.store import Held

MODELS = [{"name": "chat", "uri": "s3://bucket-a/chat/", "sizeGB": 1, "priority": 1},
          {"name": "embed", "uri": "s3://bucket-a/embed/", "sizeGB": 1, "required": True},
          {"name": "canary", "uri": "s3://bucket-a/canary/", "sizeGB": 1, "priority": 7}]


def prof(models_=MODELS, **kw):
    return profile.from_dict(v(metadata__name="multi", spec__models=models_, **kw))


def test_the_first_model_warms_first_then_the_required_then_the_rest_by_priority(tmp_path):
    p = prof()
    ts = plan.targets(p, tmp_path)
    assert [t.name for t in ts] == ["multi", "multi-embed", "multi-canary", "multi-chat"]
    assert [t.required for t in ts] == [True, True, False, False]
    # Each model has its own folder, named as the renderer names the pod's hostPath (api.podlayout).
    assert len({t.dest for t in ts}) == 4
    assert all(t.dest.parent.parent == tmp_path / "nodewarm" / "models" for t in ts)
    assert ts[1].dest.parent.name == "multi-embed"


def pod(volumes, phase="Running"):
    return {"spec": {"volumes": volumes}, "status": {"phase": phase}}


def test_a_folder_is_in_use_when_a_running_pod_mounts_it_or_what_holds_it(tmp_path):
    p = prof()
    cm = p.nodes.cache_mount
    chat, embed = (t.dest for t in plan.targets(p, tmp_path)[3:0:-2])
    pods = [pod([{"name": "w", "hostPath": {"path": f"{cm}/nodewarm/models/multi-chat/{chat.name}"}},
                 {"name": "cfg", "configMap": {"name": "x"}}]),
            pod([{"name": "w", "hostPath": {"path": f"{cm}/nodewarm/models/multi-embed/{embed.name}"}}], "Succeeded"),
            pod([{"name": "other", "hostPath": {"path": "/var/log"}}])]
    used = plan.used_folders(pods, cm, tmp_path)
    assert plan.in_use(chat, used) and not plan.in_use(embed, used)    # a finished pod uses nothing
    everything = plan.used_folders([pod([{"name": "all", "hostPath": {"path": f"{cm}/nodewarm"}}])], cm, tmp_path)
    assert plan.in_use(chat, everything) and plan.in_use(embed, everything)


def rendered_agent_daemonset(p) -> dict:
    """The node agent's DaemonSet as `nodewarm render` emits it for ``p`` (Auto Mode, Bottlerocket)."""
    from nodewarm import instancetypes
    from nodewarm.api import agentpod
    from nodewarm.nodeclasses.render import render

    ds, = (d for d in render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
           if d["kind"] == "DaemonSet" and d["metadata"]["name"] == agentpod.daemonset_name(p.nodes.node_pool))
    return ds


def daemonset_pod(ds: dict, name: str, uid: str, namespace: str | None = None, owned: bool = True) -> dict:
    """A pod of ``ds`` as the DaemonSet controller makes it (or, with ``namespace``/``owned``, a user's copy of one)."""
    md = {"namespace": namespace or ds["metadata"]["namespace"], "name": name, "uid": uid,
          "labels": dict(ds["spec"]["template"]["metadata"]["labels"])}
    if owned:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds["metadata"]["name"],
                                  "uid": "ds-uid", "controller": True, "blockOwnerDeletion": True}]
    return {"metadata": md, "spec": {**ds["spec"]["template"]["spec"], "nodeName": "n"},
            "status": {"phase": "Running"}}


def test_the_agents_own_pods_use_no_model_and_any_other_pod_that_mounts_the_root_keeps_them_all(tmp_path):
    """On Auto Mode and Bottlerocket the agent is the DaemonSet's pod, which mounts the whole NVMe root: that pod (and
    an older one of the same DaemonSet, during its rolling update) uses no model; a user's pod that mounts the root
    keeps every model, whatever labels or owner it claims."""
    from nodewarm.api.agentpod import PodRef

    p = profile.from_dict(v("automode", metadata__name="multi", spec__models=MODELS))
    cm = p.nodes.cache_mount
    ds = rendered_agent_daemonset(p)
    ns, ds_name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    assert {"name": "nvme", "hostPath": {"path": cm, "type": "Directory"}} in ds["spec"]["template"]["spec"]["volumes"]
    first, embed, canary, chat = (t.dest for t in plan.targets(p, tmp_path))
    me = daemonset_pod(ds, f"{ds_name}-x7k2p", "uid-me")
    older = daemonset_pod(ds, f"{ds_name}-q9r4t", "uid-older")        # the rolling update's pod still going
    vllm_chat = pod([{"name": "w", "hostPath": {"path": f"{cm}/nodewarm/models/multi-chat/{chat.name}"}}])
    agent = plan.agent_pods(p, PodRef(ns, me["metadata"]["name"], "uid-me"))

    used = plan.used_folders([me, older, vllm_chat], cm, tmp_path, agent)
    assert [plan.in_use(d, used) for d in (first, embed, canary, chat)] == [False, False, False, True]
    # The agent's own pod is known by its identity alone (its DaemonSet is no longer the profile's, say).
    assert plan.used_folders([me, vllm_chat], cm, tmp_path, plan.AgentPods(agent.own)) == used
    # Told neither (used_folders' default), it takes the agent's pod for a user's: nothing recognises it by its looks.
    assert plan.in_use(first, plan.used_folders([older], cm, tmp_path, plan.AgentPods()))

    # A pod that claims to be the agent by its labels, by the DaemonSet's name in another namespace (an owner
    # reference names an owner in the pod's own namespace), by its name without the uid, or a pod of the agent's
    # namespace that no DaemonSet of the agent controls: each mounts the root, each keeps every model.
    impostors = {
        "labels": daemonset_pod(ds, "lookalike", "uid-1", namespace="default", owned=False),
        "owner elsewhere": daemonset_pod(ds, "lookalike", "uid-2", namespace="default"),
        "name, other uid": daemonset_pod(ds, me["metadata"]["name"], "uid-3", owned=False),
        "not controlled": daemonset_pod(ds, "helper", "uid-4", owned=False),
    }
    for why, impostor in impostors.items():
        used = plan.used_folders([me, older, impostor], cm, tmp_path, agent)
        assert all(plan.in_use(d, used) for d in (first, embed, canary, chat)), why
    # So pulling canary (priority 7) may evict chat (priority 1) beside the agent's pods, but not beside a user's pod
    # that mounts the whole root.
    wanted = plan.targets(p, tmp_path)       # multi, multi-embed, multi-canary, multi-chat
    held = [Held(chat, chat.parent.name, chat.name, complete=True, last_used=1.0)]
    assert chat not in plan.protected(wanted[2], wanted, plan.used_folders([me, older], cm, tmp_path, agent),
                                          held)
    root = pod([{"name": "all", "hostPath": {"path": cm}}])
    keep = plan.protected(wanted[2], wanted, plan.used_folders([me, older, root], cm, tmp_path, agent), held)
    assert keep[chat] == "in use by a pod on this node"


def test_the_agent_in_the_daemonsets_pod_knows_that_pod_from_the_env_rendered_for_it(monkeypatch):
    """`bootstrap run` as the rendered container starts it, with its env as the kubelet fills it in: the agent's
    options name its own pod. As a host service (AL2023: no such env) it has none."""
    import argparse

    from nodewarm.api.agentpod import PodRef
    from nodewarm.bootstrap import agent_cli
    from support.bootstrap_fixtures import kubelet_env

    p = profile.from_dict(v("automode", metadata__name="multi", spec__models=MODELS))
    ds = rendered_agent_daemonset(p)
    own = daemonset_pod(ds, f"{ds['metadata']['name']}-x7k2p", "0f6c1d2e-uid")
    container = own["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    agent_cli.register_bootstrap(parser.add_subparsers().add_parser("bootstrap").add_subparsers())
    args = parser.parse_args(container["args"])
    for name in ("NODE_NAME", "POD_NAMESPACE", "POD_NAME", "POD_UID"):
        monkeypatch.delenv(name, raising=False)
    assert agent_cli._follow_options(args).agent_pod is None
    for name, value in kubelet_env(container, own).items():
        monkeypatch.setenv(name, value)
    opts = agent_cli._follow_options(args)
    assert opts.agent_pod == PodRef(ds["metadata"]["namespace"], own["metadata"]["name"], "0f6c1d2e-uid")
    assert opts.node_name == "n" and plan.agent_pods(p, opts.agent_pod).recognise(own)


def test_nothing_required_in_use_or_as_important_may_make_room(tmp_path):
    p = prof()
    first, embed, canary, chat = plan.targets(p, tmp_path)
    stale = tmp_path / "nodewarm" / "models" / "multi-chat" / "0123456789ab"      # chat's old generation
    held = [Held(d, d.parent.name, d.name, complete=True, last_used=1.0)
            for d in (first.dest, embed.dest, canary.dest, stale)]
    # Pulling chat (priority 1): the required ones and canary (priority 7) stay; chat's old folder may go.
    keep = plan.protected(chat, plan.targets(p, tmp_path), set(), held)
    assert set(keep) == {chat.dest, first.dest, embed.dest, canary.dest}
    assert keep[canary.dest].startswith("priority 7")
    # Pulling canary: chat (priority 1) may make room, unless a pod mounts it.
    assert chat.dest not in plan.protected(canary, plan.targets(p, tmp_path), set(), held)
    keep = plan.protected(canary, plan.targets(p, tmp_path), {stale}, held)
    assert keep[stale] == "in use by a pod on this node"


def test_a_required_further_model_is_pulled_before_warm_and_the_rest_are_not(tmp_path):
    from nodewarm.bootstrap.followplan import FollowOptions, agent_config
    from nodewarm.bootstrap.profilesource import Resolved
    from nodewarm.api.generation import generation

    p = prof()
    r = Resolved(p, generation(p), plan.targets(p, tmp_path)[0].dest, "1")
    cfg = agent_config(r, FollowOptions(profile="multi", mount=tmp_path, node_name="n"))
    assert [m.name for m in cfg.extras] == ["multi-embed"] and cfg.report_models
    assert cfg.extras[0].spec.model == "/models/multi-embed"     # vLLM's model string: part of the cache key
    assert not agent_config(Resolved(prof([]), "g", tmp_path, "1"),
                            FollowOptions(profile="multi", mount=tmp_path, node_name="n")).report_models
