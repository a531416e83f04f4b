"""The pure parts of snapshots: a runc command line, the key and how two keys differ, what the node says of
itself, and the store's rules (whole or absent, checked before use)."""

from __future__ import annotations

import json

import pytest

from nodewarm.bootstrap.snapshot import key as snapkey
from nodewarm.bootstrap.snapshot import devshm, nodefacts, runcargs
from nodewarm.bootstrap.snapshot.store import SnapshotUnusable, Store, verify

SHIM_CREATE = ["--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json", "--log-format", "json",
               "--systemd-cgroup", "create", "--bundle", "/run/x", "--pid-file", "/run/x/init.pid", "abc123"]


def test_a_shim_create_is_read_and_becomes_a_detached_restore_with_the_same_bundle_pid_file_and_globals():
    call = runcargs.parse(SHIM_CREATE)
    assert call.command == "create" and call.container_id == "abc123"
    assert call.global_option("--root") == "/run/containerd/runc/k8s.io"
    assert runcargs.restore_argv(call, "/snap/images", "/snap/work") == [
        "--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json", "--log-format", "json",
        "--systemd-cgroup", "restore", "--detach", "--image-path", "/snap/images", "--work-path", "/snap/work",
        "--bundle", "/run/x", "--pid-file", "/run/x/init.pid", "abc123"]


def test_options_in_either_spelling_and_calls_without_an_id():
    call = runcargs.parse(["--root=/r", "create", "-b", "/b", "--console-socket=/s.sock", "--no-pivot", "id1"])
    assert call.global_option("--root") == "/r" and call.option("--bundle", "-b") == "/b"
    argv = runcargs.restore_argv(call, "/i", "/w")
    assert argv[-4:] == ["--console-socket", "/s.sock", "--no-pivot", "id1"] and "--bundle" in argv
    assert runcargs.parse(["--version"]).command == "" and runcargs.parse(["--version"]).container_id == ""
    assert runcargs.parse(["state", "x"]).container_id == "x"
    with pytest.raises(ValueError):
        runcargs.restore_argv(runcargs.parse(["start", "x"]), "/i", "/w")


FACTS = snapkey.NodeFacts(kernel="6.1", cpu_model="EPYC", cpu_flags="f" * 16, gpus="", runc="runc 1.1.5",
                          criu="4.2.1")


def bundle_config(**env) -> dict:
    return {"process": {"args": ["vllm", "serve", "/models/m"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "env": [f"{k}={v}" for k, v in env.items()]},
            "annotations": {snapkey.CONTAINER_NAME_ANNOTATION: "vllm",
                            snapkey.IMAGE_NAME_ANNOTATION: "registry.local/serving:1"},
            "mounts": [{"destination": "/dev/shm", "type": "bind", "source": "/var/lib/kubelet/pods/p/shm",
                        "options": ["rbind", "rw"]}]}


def test_the_key_leaves_out_the_pod_name_and_names_every_other_difference():
    a = snapkey.from_bundle(bundle_config(HOSTNAME="pod-a", VLLM_X="1"), ("/l/1", "/l/2"), FACTS)
    b = snapkey.from_bundle(bundle_config(HOSTNAME="pod-b", VLLM_X="1"), ("/l/1", "/l/2"), FACTS)
    assert a.digest() == b.digest() and a.slot == b.slot and a.slot.startswith("vllm-")
    assert snapkey.differences(a.to_dict(), json.loads(json.dumps(b.to_dict()))) == []

    other = snapkey.from_bundle(bundle_config(VLLM_X="2", NEW="y"), ("/l/1", "/l/3"),
                                snapkey.NodeFacts(**{**FACTS.__dict__, "criu": "4.3", "kernel": "6.2"}))
    assert snapkey.differences(a.to_dict(), other.to_dict()) == [
        "env.NEW", "env.VLLM_X", "layers", "node.criu", "node.kernel"]


def test_another_model_is_another_slot():
    a = snapkey.from_bundle(bundle_config(), (), FACTS)
    cfg = bundle_config()
    cfg["process"]["args"][-1] = "/models/other"
    assert snapkey.from_bundle(cfg, (), FACTS).slot != a.slot


def test_what_the_node_says_of_itself():
    assert nodefacts.parse_criu_version("Version: 4.2.1\nGitID: v4.2.1\n") == (4, 2, 1)
    assert nodefacts.parse_criu_version("Version: 4.2\n") == (4, 2, 0)
    with pytest.raises(ValueError):
        nodefacts.parse_criu_version("criu: command not found")
    model, flags = nodefacts.parse_cpu("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: sse avx2 fpu\n"
                                       "processor\t: 1\nmodel name\t: other\nflags\t: x\n")
    assert model == "AMD EPYC" and flags == nodefacts.parse_cpu("flags : fpu sse avx2\n")[1]
    assert flags != nodefacts.parse_cpu("flags : fpu sse\n")[1]


def test_the_layers_are_the_overlay_s_lower_directories_of_the_last_mount_at_the_root():
    mountinfo = (
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "50 1 0:40 / /run/c/k8s.io/abc/rootfs rw - tmpfs tmpfs rw\n"
        "51 1 0:41 / /run/c/k8s.io/abc/rootfs rw,relatime - overlay overlay "
        "rw,lowerdir=/var/lib/s/3/fs:/var/lib/s/2/fs,upperdir=/var/lib/s/4/fs,workdir=/var/lib/s/4/work\n"
        "52 1 0:42 / /run/with\\040space rw - overlay overlay rw,lowerdir=/a\n")
    assert nodefacts.parse_rootfs_layers(mountinfo, "/run/c/k8s.io/abc/rootfs") == (
        "/var/lib/s/3/fs", "/var/lib/s/2/fs")
    assert nodefacts.parse_rootfs_layers(mountinfo, "/run/with space") == ("/a",)
    assert nodefacts.parse_rootfs_layers(mountinfo, "/") == ("ext4:/dev/sda1:/",)
    assert nodefacts.parse_rootfs_layers(mountinfo, "/nowhere") == ()


def test_a_bind_mounted_dev_shm_becomes_the_container_s_own_tmpfs_and_nothing_else_changes():
    config = bundle_config()
    config["mounts"].insert(0, {"destination": "/proc", "type": "proc", "source": "proc"})
    own = devshm.with_own_shm(config)
    assert own["mounts"] == [config["mounts"][0], devshm.OWN_SHM] and own["process"] == config["process"]
    assert config["mounts"][1]["type"] == "bind", "the input is not changed in place"
    assert devshm.with_own_shm(own) is None
    assert devshm.with_own_shm({"mounts": [{"destination": "/proc", "type": "proc"}]}) is None


def _staged(store: Store, slot: str, payload: bytes = b"pages") -> None:
    staging = store.stage(slot)
    (staging / "images" / "pages-1.img").write_bytes(payload)
    (staging / "images" / "pstree.img").write_bytes(b"tree")
    store.publish(staging, slot, {"k": slot})


def test_the_store_is_root_only_and_a_slot_is_replaced_whole(tmp_path):
    store = Store(tmp_path / "s").open()
    assert (store.root.stat().st_mode & 0o777) == 0o700
    assert store.criu_config.read_text() == "link-remap\n"
    _staged(store, "vllm-1", b"old")
    _staged(store, "vllm-1", b"new")
    snap = store.lookup("vllm-1")
    assert (snap.images / "pages-1.img").read_bytes() == b"new" and snap.key == {"k": "vllm-1"}
    verify(snap)
    assert store.slots() == ["vllm-1"] and not list(store.root.glob(".old-*"))
    assert store.remove("vllm-1") and store.lookup("vllm-1") is None and not store.remove("vllm-1")


def test_what_a_crash_left_half_written_is_swept_and_never_looked_up(tmp_path):
    store = Store(tmp_path / "s").open()
    half = store.stage("vllm-1")
    (half / "images" / "pages-1.img").write_bytes(b"half")
    assert store.lookup("vllm-1") is None and store.slots() == []
    Store(store.root).open()
    assert half.exists(), "opening the store (every create does) leaves a checkpoint in progress alone"
    Store(store.root).sweep()
    assert not half.exists()


@pytest.mark.parametrize("damage, said", [
    (lambda s: (s.images / "pages-1.img").write_bytes(b"pageS"), "images/pages-1.img is 5 bytes with another digest"),
    (lambda s: (s.images / "pages-1.img").write_bytes(b"pa"), "corrupt or truncated"),
    (lambda s: (s.images / "pstree.img").unlink(), "images/pstree.img is missing"),
    (lambda s: (s.images / "extra.img").write_bytes(b"x"), "images/extra.img is not in its manifest"),
    (lambda s: (s.path / "manifest.json").write_text("{"), "its manifest cannot be read"),
])
def test_a_snapshot_that_does_not_match_its_manifest_is_unusable(tmp_path, damage, said):
    store = Store(tmp_path / "s").open()
    _staged(store, "vllm-1")
    snap = store.lookup("vllm-1")
    damage(snap)
    with pytest.raises(SnapshotUnusable, match=said.replace("(", r"\(")):
        verify(snap)


def test_restored_marks_are_per_container_and_refuse_paths(tmp_path):
    store = Store(tmp_path / "s").open()
    store.mark_restored("abc")
    assert store.was_restored("abc") and not store.was_restored("abd")
    store.forget("abc")
    assert not store.was_restored("abc")
    with pytest.raises(ValueError):
        store.mark_restored("../x")
