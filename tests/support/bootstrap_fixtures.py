"""Helpers shared by the bootstrap tests: real safetensors files, models in the local S3 server, loop volumes, fault
proxies and compile-cache stores over it, the node's own kubeconfig. Their fixtures are in tests/bootstrap/conftest.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

KiB = 1024


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], seed: int = 0) -> bytes:
    """A valid safetensors file: 8-byte LE header length, JSON header, then the tensors' bytes."""
    itemsize = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1}
    header, blobs, off = {}, [], 0
    rnd = random.Random(seed)
    for name, (dtype, shape) in tensors.items():
        n = itemsize[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(rnd.randbytes(n))
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def model_files(shards: int = 3, mib_per_shard: float = 2.0, seed: int = 0) -> dict[str, bytes]:
    """A model-like set: N safetensors shards plus the small JSON/tokenizer files vLLM reads."""
    rows = int(mib_per_shard * 1024 * 1024 / (1024 * 4))
    files = {f"model-{i + 1:05d}-of-{shards:05d}.safetensors":
             safetensors_bytes({f"layers.{i}.weight": ("F32", [rows, 1024]), f"layers.{i}.bias": ("F16", [1024])},
                               seed=seed * 100 + i)
             for i in range(shards)}
    files["config.json"] = json.dumps({"architectures": ["TestForCausalLM"], "seed": seed}).encode()
    files["tokenizer.json"] = b'{"version": "1.0"}'
    files["tokenizer_config.json"] = b"{}"
    return files


def new_bucket() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def put_model(server, files: dict[str, bytes], prefix: str = "models/test/", bucket: str | None = None) -> str:
    """Lay files into the rclone server's directory and wait until S3 lists them. Returns the s3:// URI."""
    bucket = bucket or new_bucket()
    root = server.data_dir / bucket / prefix
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    client = server.client()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0)
        except Exception:  # noqa: BLE001 - bucket not visible yet
            listed = 0
        if listed >= len(files):
            break
        time.sleep(0.2)
    return f"s3://{bucket}/{prefix}"


@contextmanager
def loop_volume(work: Path, size_mib: int, fstype: str = "ext4") -> Iterator[Path]:
    """A real, small filesystem on a loop device (for free-space checks and a genuine ENOSPC)."""
    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which(f"mkfs.{fstype}"):
        pytest.skip(f"needs root, losetup and mkfs.{fstype} to loop-mount a small volume")
    image, mnt = work / f"vol.{fstype}.img", work / "vol"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    mkfs = [f"mkfs.{fstype}", "-q"] + (["-m", "0"] if fstype == "ext4" else []) + [str(image)]
    subprocess.run(mkfs, check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        image.unlink(missing_ok=True)


def point_aws_env(server, monkeypatch) -> None:
    """The standard AWS environment pointed at ``server``, for the test's duration."""
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)


def cache_store(server, monkeypatch, uri: str):
    """A compile-cache store as the agent and the publisher make it: its own S3 client from the AWS
    environment (here pointed at ``server``), so the tests run with the client settings a node has."""
    from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri

    point_aws_env(server, monkeypatch)
    return CacheStore(parse_uri(uri))


def proxied(server, monkeypatch):
    """For fixtures: a fault proxy in front of ``server``, with the AWS environment pointing at it."""
    from nodewarm_dev.testenv.faultproxy import FaultProxy

    p = FaultProxy(server.endpoint)
    point_aws_env(server, monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    yield p
    p.stop()


def node_kubeconfig(kube, tmp_path, node: str):
    """A kubeconfig with ``node``'s kubelet identity: what the agent runs as (never admin)."""
    return kube.write_kubeconfig(tmp_path / f"kubeconfig-{node}", kube.node_token(node), f"system:node:{node}")


def warm(uri: str, dest: Path, load_check: bool = False, stream_check: bool = False, stop=None, peers=None,
         holdings=None, **pull):
    """warm_weights as tests use it: not on NVMe here, no headroom, small parts, fast bounded retries."""
    from nodewarm.bootstrap.weights.capacity import Headroom
    from nodewarm.bootstrap.s3client import RetryPolicy
    from nodewarm.bootstrap.weights import WeightsConfig, warm_weights
    from nodewarm.bootstrap.weights.loadcheck import StreamerTuning

    overrides = {"concurrency": 4, "part_size": 512 * KiB, "stall_timeout_s": 1.0, "connect_timeout_s": 2.0,
                 "request_timeout_s": 10.0, "retry": RetryPolicy(attempts=4, base_s=0.01, cap_s=0.05), **pull}
    return warm_weights(WeightsConfig(uri=uri, dest=dest, allow_non_nvme=True, headroom=Headroom(0, 0),
                                      load_check=load_check, progress_interval_s=0.5, pull_overrides=overrides,
                                      streamer=StreamerTuning() if stream_check else None, stop=stop,
                                      peers=peers, holdings=holdings))


def visible_files(dest: Path) -> dict[str, bytes]:
    """What a loader would see under DEST: every file outside nodewarm's own .nodewarm/ folder."""
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*"))
            if p.is_file() and ".nodewarm" not in p.relative_to(dest).parts}


class RunningAgent:
    """A Follower in a thread, as the systemd unit or the DaemonSet runs it (``opts``: more FollowOptions)."""

    def __init__(self, kube, tmp_path, node: str, name: str, once: bool = False, **opts):
        import threading

        from kubernetes import config

        from nodewarm.bootstrap.follow import Follower
        from nodewarm.bootstrap.followplan import FollowOptions

        api = config.new_client_from_config(config_file=str(node_kubeconfig(kube, tmp_path, node)))
        self.mount = tmp_path / f"nvme-{node}"
        self.mount.mkdir(exist_ok=True)
        self.stop = threading.Event()
        self.follower = Follower(api, FollowOptions(profile=name, mount=self.mount, node_name=node, load_check=False,
                                                    once=once, **{"watch_timeout_s": 5, "poll_s": 0.2,
                                                                  "retry_s": 30, **opts}), self.stop)
        self.thread = threading.Thread(target=self.follower.run, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the agent did not stop"


def kubelet_env(container: dict, pod: dict) -> dict[str, str]:
    """A container's env as the kubelet resolves it for ``pod`` (as the API returns it): values, and the downward
    API's fieldRef paths read from the pod."""
    out = {}
    for e in container.get("env") or ():
        if "value" in e:
            out[e["name"]] = e["value"]
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        value = pod
        for key in path.split("."):
            value = value[key]
        assert isinstance(value, str), (path, value)
        out[e["name"]] = value
    return out


def serving_node(k, fresh_node, name: str, labels: dict[str, str], gpus: int = 4) -> None:
    """A node that already serves: registered, Ready, GPUs allocatable, no startup taint left."""
    from nodewarm.controller.kube import NODES

    fresh_node(name, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], labels=labels)
    res = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    k.request("PATCH", NODES.path(name, sub="status"), body={"status": {"conditions": [ready], "capacity": res,
                                                                          "allocatable": res}},
              content_type="application/strategic-merge-patch+json")
    # The API server adds node.kubernetes.io/not-ready at creation; the node lifecycle controller (not run
    # here) lifts it once Ready, as on a real cluster.
    k.merge_patch(NODES, name, {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}})
