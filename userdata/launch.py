"""What a node needs to start the nodewarm bootstrap: where the code is, its pin, and the bootstrap's arguments.

Deliberately independent of the WarmProfile: the renderer maps a profile onto a BootstrapLaunch, and every
launcher (AL2023 user data, the DaemonSet) renders from this one value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UserDataInvalid

MODES = ("karpenter", "automode")

# Values end up unquoted in a systemd ExecStart= line and in a shell heredoc. systemd expands `$` and `%`,
# the shell splits on spaces: rather than quote for two grammars, accept only characters neither treats
# specially (S3 keys, paths, regions and profile names fit in it).
_SAFE = re.compile(r"^[A-Za-z0-9._/:=@+,-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+[^/]$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


@dataclass(frozen=True)
class BootstrapLaunch:
    """Everything one node needs; validated on construction so every renderer can trust it.

    ``artifact_uri``/``artifact_sha256`` come from ``nodewarm package`` (AL2023 user data needs them); the
    node refuses an artifact whose sha256 differs. ``cache_mount`` is the NVMe RAID mount
    (``/mnt/k8s-disks/0`` on AL2023 with ``instanceStorePolicy: RAID0``, ``/mnt/.ephemeral`` on Bottlerocket
    and Auto Mode); ``dest_dir`` must be inside it so the weights land on NVMe, never on the root volume.
    """

    profile: str
    model_uri: str
    dest_dir: str
    mode: str
    cache_mount: str
    region: str
    nodewarm_version: str
    # The DaemonSet launcher (Bottlerocket, Auto Mode) runs an image instead and needs no artifact.
    artifact_uri: str | None = None
    artifact_sha256: str | None = None
    compile_cache_uri: str | None = None
    # The rest of the compile-cache key the node must match (tensor parallelism, vLLM engine flags, the
    # bundle verify key), as `bootstrap run` options: the node has no other way to learn them.
    cache_key_args: tuple[str, ...] = ()
    # The vLLM pod's streamer settings, so the node's load check reads the weights as serving will.
    streamer_concurrency: int | None = None
    streamer_chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.artifact_uri is None) != (self.artifact_sha256 is None):
            _bad("artifact_sha256", self.artifact_sha256, "both artifact_uri and artifact_sha256, or neither")
        if self.artifact_uri is not None and not _S3_URI.match(self.artifact_uri):
            _bad("artifact_uri", self.artifact_uri, "an s3://bucket/key URI of the file `nodewarm package` built")
        if self.artifact_sha256 is not None and not _SHA256.match(self.artifact_sha256):
            _bad("artifact_sha256", self.artifact_sha256, "the 64 lowercase hex digits `nodewarm package` printed")
        if self.mode not in MODES:
            _bad("mode", self.mode, f"one of {', '.join(MODES)}")
        if not _REGION.match(self.region):
            _bad("region", self.region, "an AWS region name such as us-west-2")
        for name in ("cache_mount", "dest_dir"):
            value = getattr(self, name)
            if not value.startswith("/") or "/../" in f"{value}/":
                _bad(name, value, "an absolute path without '..'")
        mount = self.cache_mount.rstrip("/")
        if not (self.dest_dir == mount or self.dest_dir.startswith(mount + "/")):
            _bad("dest_dir", self.dest_dir, f"a directory inside cache_mount {self.cache_mount} (the NVMe RAID)")
        for name in ("artifact_uri", "profile", "model_uri", "dest_dir", "compile_cache_uri", "cache_mount",
                     "nodewarm_version"):
            value = getattr(self, name)
            if value is not None and not _SAFE.match(value):
                _bad(name, value, "only letters, digits and . _ / : = @ + , - (it is written unquoted into a "
                                  "systemd unit and a shell script)")

        for value in self.cache_key_args:
            if not _SAFE.match(value):
                _bad("cache_key_args", value, "only letters, digits and . _ / : = @ + , -")
        for name in ("streamer_concurrency", "streamer_chunk_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                _bad(name, value, "a positive integer (from the profile's serving settings)")

    def bootstrap_argv(self) -> list[str]:
        """The arguments after `nodewarm` that start the warm-up on the node."""
        argv = ["bootstrap", "run",
                "--profile", self.profile,
                "--model-uri", self.model_uri,
                "--dest", self.dest_dir,
                "--mode", self.mode,
                "--mount", self.cache_mount,
                "--region", self.region]
        if self.compile_cache_uri:
            argv += ["--compile-cache-uri", self.compile_cache_uri, *self.cache_key_args]
        if self.artifact_uri:
            # The artifact runs on the host's python with the standard library and nodewarm's pure-Python
            # deps: no torch, so the Run:ai streamer load check cannot run there (the DaemonSet image can).
            argv.append("--skip-load-check")
        else:
            if self.streamer_concurrency is not None:
                argv += ["--streamer-concurrency", str(self.streamer_concurrency)]
            if self.streamer_chunk_bytes is not None:
                argv += ["--streamer-chunk-bytes", str(self.streamer_chunk_bytes)]
        return argv


def _bad(field: str, value, fix: str):
    raise UserDataInvalid(f"BootstrapLaunch.{field}: {value!r} is not valid: use {fix}")
