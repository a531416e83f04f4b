"""The agent's plan for a profile's further models (bootstrap/modelset.py), without servers: the order they warm in,
which folders a pod uses (read from the pods' hostPath volumes, as the API returns them), and what may never make
room for what."""

from __future__ import annotations

from support.builders import v
from nodewarm import profile
from nodewarm.api import models
from nodewarm.api.names import MODELS_ANNOTATION
from nodewarm.bootstrap import modelset
from nodewarm.bootstrap.modelstore import Held

MODELS = [{"name": "chat", "uri": "s3://bucket-a/chat/", "sizeGB": 1, "priority": 1},
          {"name": "embed", "uri": "s3://bucket-a/embed/", "sizeGB": 1, "required": True},
          {"name": "canary", "uri": "s3://bucket-a/canary/", "sizeGB": 1, "priority": 7}]


def prof(models_=MODELS, **kw):
    return profile.from_dict(v(metadata__name="multi", spec__models=models_, **kw))


def test_the_first_model_warms_first_then_the_required_then_the_rest_by_priority(tmp_path):
    p = prof()
    ts = modelset.targets(p, tmp_path)
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
    chat, embed = (t.dest for t in modelset.targets(p, tmp_path)[3:0:-2])
    pods = [pod([{"name": "w", "hostPath": {"path": f"{cm}/nodewarm/models/multi-chat/{chat.name}"}},
                 {"name": "cfg", "configMap": {"name": "x"}}]),
            pod([{"name": "w", "hostPath": {"path": f"{cm}/nodewarm/models/multi-embed/{embed.name}"}}], "Succeeded"),
            pod([{"name": "other", "hostPath": {"path": "/var/log"}}])]
    used = modelset.used_folders(pods, cm, tmp_path)
    assert modelset.in_use(chat, used) and not modelset.in_use(embed, used)    # a finished pod uses nothing
    everything = modelset.used_folders([pod([{"name": "all", "hostPath": {"path": f"{cm}/nodewarm"}}])], cm, tmp_path)
    assert modelset.in_use(chat, everything) and modelset.in_use(embed, everything)


def test_nothing_required_in_use_or_as_important_may_make_room(tmp_path):
    p = prof()
    first, embed, canary, chat = modelset.targets(p, tmp_path)
    stale = tmp_path / "nodewarm" / "models" / "multi-chat" / "0123456789ab"      # chat's old generation
    held = [Held(d, d.parent.name, d.name, complete=True, last_used=1.0)
            for d in (first.dest, embed.dest, canary.dest, stale)]
    # Pulling chat (priority 1): the required ones and canary (priority 7) stay; chat's old folder may go.
    keep = modelset.protected(chat, modelset.targets(p, tmp_path), set(), held)
    assert set(keep) == {chat.dest, first.dest, embed.dest, canary.dest}
    assert keep[canary.dest].startswith("priority 7")
    # Pulling canary: chat (priority 1) may make room, unless a pod mounts it.
    assert chat.dest not in modelset.protected(canary, modelset.targets(p, tmp_path), set(), held)
    keep = modelset.protected(canary, modelset.targets(p, tmp_path), {stale}, held)
    assert keep[stale] == "in use by a pod on this node"


def test_the_report_is_written_only_when_it_changed():
    sent = []
    book = modelset.Book(sent.append)
    book.put(models.HeldModel("multi-embed", models.WARM, "g1", key="k1"))
    assert book.publish() and not book.publish()
    book.put(models.HeldModel("multi-embed", models.EVICTING, "g1", key="k1"))
    assert book.publish()
    assert [models.decode(s[MODELS_ANNOTATION])["multi-embed"].state for s in sent] == ["warm", "evicting"]
    book._write = lambda ann: (_ for _ in ()).throw(OSError("API down"))
    book.put(models.HeldModel("multi-embed", models.WARM, "g1", key="k1"))
    assert not book.publish()                 # failed: tried again at the next publish
    book._write = sent.append
    assert book.publish()


def test_a_required_further_model_is_pulled_before_warm_and_the_rest_are_not(tmp_path):
    from nodewarm.bootstrap.follow import FollowOptions, agent_config
    from nodewarm.bootstrap.profilesource import Resolved
    from nodewarm.api.generation import generation

    p = prof()
    r = Resolved(p, generation(p), modelset.targets(p, tmp_path)[0].dest, "1")
    cfg = agent_config(r, FollowOptions(profile="multi", mount=tmp_path, node_name="n"))
    assert [m.name for m in cfg.extras] == ["multi-embed"] and cfg.report_models
    assert cfg.extras[0].spec.model == "/models/multi-embed"     # vLLM's model string: part of the cache key
    assert not agent_config(Resolved(prof([]), "g", tmp_path, "1"),
                            FollowOptions(profile="multi", mount=tmp_path, node_name="n")).report_models
