"""`nodewarm status` for many models per node (#33): each model the agent reports on its Node, whether the Node
carries its label, and a NoCapacity failure's message; in the table (-o wide), the explanation and -o json."""

from __future__ import annotations

import json

from nodewarm.api import models
from nodewarm.api.models import HeldModel
from nodewarm.api.names import GENERATION_LABEL, MODEL_LABEL_PREFIX, MODELS_ANNOTATION
from nodewarm.status.explain import explain
from nodewarm.status.observed import Observed
from nodewarm.status.rows import rows
from nodewarm.status.text import format_explanation, format_rows
from support.builders import condition, node, nodeclaim, v

NOW = 1_800_000_000.0
GB = 10**9
P = "qwen3-35b"
NO_ROOM = "needs 80 GB, 30 GB free after evicting qwen3-35b-tiny"


def serving(held, labels) -> Observed:
    c = nodeclaim("c1", created=NOW - 900, launched=NOW - 880, registered=NOW - 800)
    n = node("n1", claim=c, created=NOW - 802, taints=(), labels=labels,
             warm=condition("nodewarm.io/Warm", "True", "WeightsVerified", NOW - 600, "ok"),
             annotations={MODELS_ANNOTATION: models.encode(held)})
    return Observed(nodes=[n], claims=[c], profiles=[v()])


HELD = [HeldModel(P, models.WARM, generation="g0", bytes=60 * GB, required=True, last_used="2027-01-01T10:00:00Z"),
        HeldModel(f"{P}-small", models.WARM, generation="g1", bytes=8 * GB, pending="g4",
                  last_used="2027-01-01T09:00:00Z"),
        HeldModel(f"{P}-tiny", models.EVICTING, generation="g2", bytes=2 * GB),
        HeldModel(f"{P}-big", models.FAILED, pending="g7", reason=models.NO_CAPACITY, message=NO_ROOM)]
LABELS = {GENERATION_LABEL: "g0", f"{MODEL_LABEL_PREFIX}{P}-small": "g1", f"{MODEL_LABEL_PREFIX}{P}-tiny": "g1"}


def test_each_model_with_its_label_size_last_use_roll_and_why_it_failed():
    (r,) = rows(serving(HELD, LABELS), NOW)
    got = {m.name: m for m in r.models}
    assert [(m.state, m.generation, m.labelled) for m in (got[P], got[f"{P}-small"], got[f"{P}-tiny"])] == [
        ("warm", "g0", True), ("warm", "g1", True), ("evicting", "g2", False)]   # tiny's label is another gen
    assert got[f"{P}-big"].labelled is False and got[f"{P}-big"].message == NO_ROOM
    assert got[f"{P}-small"].pending == "g4" and got[f"{P}-small"].bytes == 8 * GB


def test_explain_and_wide_show_them_and_json_keeps_the_numbers():
    obs = serving(HELD, LABELS)
    text = format_explanation(explain(obs, "n1", NOW))
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line == "Models:")
    assert lines[head + 1].split() == ["MODEL", "STATE", "GENERATION", "LABEL", "SIZE", "LAST", "USED", "PENDING",
                                       "MESSAGE"]
    small = next(line for line in lines if f"{P}-small " in line).split()
    assert small == [f"{P}-small", "warm", "g1", "yes", "8.0", "GB", "2027-01-01T09:00:00Z", "g4", "-"]
    assert f"NoCapacity: {NO_ROOM}" in next(line for line in lines if f"{P}-big " in line)
    wide = format_rows(rows(obs, NOW), wide=True).splitlines()
    col = wide[0].split().index("MODELS")
    assert wide[1].split()[col] == (f"{P}=warm,{P}-small=warm,{P}-tiny=evicting,{P}-big=failed(NoCapacity)")
    d = json.loads(json.dumps({"items": [r.to_dict() for r in rows(obs, NOW)]}))
    big = next(m for m in d["items"][0]["models"] if m["name"] == f"{P}-big")
    assert big == {"name": f"{P}-big", "state": "failed", "generation": "", "labelled": False, "bytes": 0,
                   "last_used": "", "pending": "g7", "reason": "NoCapacity", "message": NO_ROOM}
    assert d["items"][0]["models"][0]["bytes"] == 60 * GB


def test_a_node_without_a_report_shows_no_models_and_an_odd_one_breaks_nothing():
    (r,) = rows(serving([], {}), NOW)
    assert r.models == () and "Models:" not in format_explanation(explain(serving([], {}), "n1", NOW))
    obs = serving([], {})
    obs.nodes[0]["metadata"]["annotations"][MODELS_ANNOTATION] = "{not json"
    assert rows(obs, NOW)[0].models == ()
