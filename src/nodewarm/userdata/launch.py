"""What a node needs to start the nodewarm agent: where the code is, its pin, and which WarmProfile to follow.

Deliberately independent of the WarmProfile: the renderer maps a profile onto a BootstrapLaunch, and every
launcher (AL2023 user data, the DaemonSet) renders from this one value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UserDataInvalid

# Values end up unquoted in a systemd ExecStart= line and in a shell heredoc. systemd expands `$` and `%`,
# the shell splits on spaces: rather than quote for two grammars, accept only characters neither treats
# specially (S3 keys, paths, regions and profile names fit in it).
_SAFE = re.compile(r"^[A-Za-z0-9._/:=@+,-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+[^/]$")
_PROFILE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class BootstrapLaunch:
    """Everything one node needs to start the agent; validated on construction so every renderer can trust it.

    Only node-level facts belong here, because the AL2023 launcher is baked into the EC2NodeClass's userData
    and Karpenter replaces every node of the class when that changes (nodewarm/karpenter/drift.py). The agent learns
    the rest (model, serving image, TP, compile cache, region...) at boot from the WarmProfile named here.

    ``artifact_uri``/``artifact_sha256`` come from ``nodewarm package`` (AL2023 user data needs them); the
    node refuses an artifact whose sha256 differs. ``cache_mount`` is the NVMe RAID mount
    (``/mnt/k8s-disks/0`` on AL2023 with ``instanceStorePolicy: RAID0``, ``/mnt/.ephemeral`` on Bottlerocket
    and Auto Mode).
    """

    profile: str
    cache_mount: str
    # The DaemonSet launcher (Bottlerocket, Auto Mode) runs an image instead and needs no artifact.
    artifact_uri: str | None = None
    artifact_sha256: str | None = None
    # Engine snapshots (spec.serving.snapshot): the AL2023 user data also installs containerd's snapshot runtime,
    # a node-level fact like the rest (turning it on or off replaces the nodes).
    snapshot: bool = False

    def __post_init__(self) -> None:
        if (self.artifact_uri is None) != (self.artifact_sha256 is None):
            _bad("artifact_sha256", self.artifact_sha256, "both artifact_uri and artifact_sha256, or neither")
        if self.artifact_uri is not None and not _S3_URI.match(self.artifact_uri):
            _bad("artifact_uri", self.artifact_uri, "an s3://bucket/key URI of the file `nodewarm package` built")
        if self.artifact_sha256 is not None and not _SHA256.match(self.artifact_sha256):
            _bad("artifact_sha256", self.artifact_sha256, "the 64 lowercase hex digits `nodewarm package` printed")
        if self.snapshot and self.artifact_uri is None:
            _bad("snapshot", self.snapshot, "snapshots only with the AL2023 user data's artifact (the runtime handler "
                                            "runs from it): set artifact_uri and artifact_sha256")
        if not _PROFILE.match(self.profile):
            _bad("profile", self.profile, "a WarmProfile name (a DNS label)")
        if not self.cache_mount.startswith("/") or "/../" in f"{self.cache_mount}/":
            _bad("cache_mount", self.cache_mount, "an absolute path without '..'")
        for name in ("artifact_uri", "cache_mount"):
            value = getattr(self, name)
            if value is not None and not _SAFE.match(value):
                _bad(name, value, "only letters, digits and . _ / : = @ + , - (it is written unquoted into a "
                                  "systemd unit and a shell script)")

    def bootstrap_argv(self) -> list[str]:
        """The arguments after `nodewarm` that start the agent on the node."""
        argv = ["bootstrap", "run", "--profile", self.profile, "--mount", self.cache_mount]
        if self.artifact_uri:
            # The artifact carries the standard library and nodewarm's dependencies but no torch, so the
            # Run:ai streamer load check cannot run there (the DaemonSet image can).
            argv.append("--skip-load-check")
        return argv


def _bad(field: str, value, fix: str):
    raise UserDataInvalid(f"BootstrapLaunch.{field}: {value!r} is not valid: use {fix}")
