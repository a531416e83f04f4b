"""nodewarm.bootstrap.modelcache.store: the eviction plan (pure) and held/evict/finish_evictions on a real folder tree."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from nodewarm.bootstrap.modelcache import store as modelstore
from nodewarm.bootstrap.confined import UnsafePath
from nodewarm.bootstrap.modelcache.store import GiB, Held

KEY_A, KEY_B, KEY_C = "a" * 12, "b" * 12, "c" * 12


def model(name: str, gib: int, last_used: float, shared: dict | None = None) -> Held:
    inodes = {(1, hash(name)): (gib * GiB, 1, 1), **(shared or {})}
    return Held(Path(f"/m/{name}/{KEY_A}"), name, KEY_A, True, last_used, inodes)


def test_least_recently_used_first_until_the_need_fits():
    old, older, recent = model("old", 10, 200.0), model("older", 10, 100.0), model("recent", 10, 300.0)
    plan = modelstore.plan_eviction([recent, old, older], need_bytes=25 * GiB, free_bytes=8 * GiB, protected={})
    assert plan.ok and plan.evict == (older, old) and plan.frees_bytes == 20 * GiB
    assert "older" in plan.message and "recent" not in plan.message
    fits = modelstore.plan_eviction([recent, old], need_bytes=5 * GiB, free_bytes=8 * GiB, protected={})
    assert fits.ok and fits.evict == ()


def test_protected_folders_are_never_chosen():
    used, idle = model("used", 50, 1.0), model("idle", 10, 500.0)
    plan = modelstore.plan_eviction([used, idle], 15 * GiB, 8 * GiB, {used.path: "a pod on the node uses it"})
    assert plan.ok and plan.evict == (idle,)


def test_nothing_is_evicted_when_it_cannot_fit_and_the_message_gives_the_sizes():
    used, idle = model("used", 50, 1.0), model("idle", 10, 500.0)
    plan = modelstore.plan_eviction([used, idle], 100 * GiB, 8 * GiB, {used.path: "required by the profile"})
    assert not plan.ok and plan.evict == () and plan.frees_bytes == 0
    for part in ("100.00 GiB needed", "8.00 GiB free", "would free only 10.00 GiB", "used/", "50.00 GiB",
                 "required by the profile"):
        assert part in plan.message


def test_files_shared_with_a_kept_model_free_nothing():
    # A roll hard-linked v1's unchanged 30 GiB into v2: evicting v1 alone frees only its own 2 GiB.
    shared = {(1, 99): (30 * GiB, 2, 1)}
    v1, v2 = model("v1", 2, 1.0, shared), model("v2", 2, 2.0, shared)
    assert v1.bytes == 32 * GiB and modelstore.freed_bytes([v1]) == 2 * GiB
    assert modelstore.freed_bytes([v1, v2]) == 34 * GiB
    assert not modelstore.plan_eviction([v1, v2], 20 * GiB, 0, {v2.path: "being pulled"}).ok
    assert modelstore.plan_eviction([v1, v2], 20 * GiB, 0, {}).evict == (v1, v2)


def make_model(root: Path, view: str, key: str, ok: bool = True, files: dict | None = None) -> Path:
    folder = root / view / key
    (folder / ".nodewarm").mkdir(parents=True)
    for name, data in (files or {"model.safetensors": b"x" * 10000}).items():
        (folder / name).write_bytes(data)
    (folder / ".nodewarm/manifest.json").write_text("{}")
    (folder / ".nodewarm/summary.json").write_text(json.dumps({"ok": ok}))
    return folder


def test_held_lists_model_folders_with_their_size_completion_and_last_use(tmp_path):
    a = make_model(tmp_path, "view", KEY_A)
    b = make_model(tmp_path, "view", KEY_B, ok=False)
    os.link(a / "model.safetensors", b / "shared.safetensors")
    (tmp_path / "view/not-a-key").mkdir()
    (tmp_path / ".evicting/view-x").mkdir(parents=True)
    os.symlink(a, tmp_path / "view" / KEY_C)
    modelstore.touch_used(a, 1234.5)
    found = {m.key: m for m in modelstore.held(tmp_path)}
    assert set(found) == {KEY_A, KEY_B}
    assert found[KEY_A].complete and not found[KEY_B].complete
    assert found[KEY_A].last_used == 1234.5
    assert found[KEY_B].last_used == (b / ".nodewarm/summary.json").stat().st_mtime
    assert found[KEY_A].bytes >= 10000 and modelstore.freed_bytes([found[KEY_A]]) < found[KEY_A].bytes


def test_evict_renames_the_whole_model_away_then_deletes_it(tmp_path):
    a, b = make_model(tmp_path, "view", KEY_A), make_model(tmp_path, "view", KEY_B)
    modelstore.evict(tmp_path, a)
    assert not a.exists() and b.exists() and list((tmp_path / ".evicting").iterdir()) == []
    assert [m.key for m in modelstore.held(tmp_path)] == [KEY_B]


def test_a_crash_after_the_rename_is_finished_at_the_next_start(tmp_path, monkeypatch):
    a = make_model(tmp_path, "view", KEY_A)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("the node lost power")

    monkeypatch.setattr(shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        modelstore.evict(tmp_path, a)
    monkeypatch.undo()
    assert modelstore.held(tmp_path) == [] and not a.exists()  # no longer held: never half a model
    assert len(list((tmp_path / ".evicting").iterdir())) == 1
    modelstore.finish_evictions(tmp_path)
    assert list((tmp_path / ".evicting").iterdir()) == []
    modelstore.finish_evictions(tmp_path / "elsewhere")  # nothing to finish: nothing happens


def test_a_crash_before_the_rename_leaves_the_whole_model_held(tmp_path, monkeypatch):
    a = make_model(tmp_path, "view", KEY_A, files={"x.safetensors": b"1", "y.json": b"2"})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("the node lost power")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        modelstore.evict(tmp_path, a)
    monkeypatch.undo()
    modelstore.finish_evictions(tmp_path)
    assert [m.key for m in modelstore.held(tmp_path)] == [KEY_A]
    assert (a / "x.safetensors").read_bytes() == b"1" and (a / "y.json").read_bytes() == b"2"


def test_links_and_folders_outside_the_models_root_are_refused(tmp_path):
    root, outside = tmp_path / "models", tmp_path / "outside"
    target = make_model(outside, "view", KEY_A)
    (root / "view").mkdir(parents=True)
    os.symlink(target, root / "view" / KEY_A)
    os.symlink(outside / "view", root / "linked")
    for bad in (root / "view" / KEY_A, root / "linked" / KEY_A, target, root / "view" / "not-a-key",
                root / ".evicting" / KEY_A, root / "view" / KEY_A / ".." / KEY_A):
        with pytest.raises(UnsafePath):
            modelstore.evict(root, bad)
    assert (target / "model.safetensors").exists() and (root / "view" / KEY_A).is_symlink()
