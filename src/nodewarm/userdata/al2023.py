"""The AL2023 user-data part that installs the nodewarm bootstrap as a systemd unit (pure rendering).

Why a unit and not inline work: cloud-init runs user-data scripts before ``nodeadm-run.service`` builds the
NVMe RAID at ``/mnt/k8s-disks/0`` and starts kubelet, and Karpenter deletes a node that has not registered
within 15 minutes. The part only writes three files and starts the unit with ``--no-block`` (blocking
would deadlock: nodeadm-run waits for cloud-final, which would wait for the unit, which waits for nodeadm-run).

How the code gets there: the unit runs ``nodewarm-launch``, which downloads the artifact built by
``nodewarm package`` with ``aws s3 cp`` (the EKS AL2023 AMI ships the AWS CLI v2, which signs with the
instance profile through IMDSv2), refuses it unless its sha256 is the one pinned here, unpacks it and runs
its ``bin/nodewarm``.

With engine snapshots on (``BootstrapLaunch.snapshot``, nodewarm.api.snapshot), the same part also writes the
seccomp profile the serving container names and ``nodewarm-runc``, the script containerd's runc shim runs in runc's
place for the snapshot runtime; a second part, a NodeConfig, adds that runtime to containerd through nodeadm.
Off, the user data is byte for byte what it was before snapshots existed: no node of a profile without them drifts.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from importlib import resources

from nodewarm.api import snapshot
from nodewarm.bootstrap.launchrecord import RECORD_FILE

from .errors import UserDataInvalid
from .launch import BootstrapLaunch
from .mime import NODE_CONFIG, NODEWARM_MARKER, SHELL_SCRIPT, Part, serialize
from .package import HANDLER_ENTRY

UNIT_NAME = "nodewarm-bootstrap.service"
# Where nodewarm-launch unpacks each artifact, by its sha256, and records a launch that failed (its defaults).
ARTIFACTS_DIR = "/opt/nodewarm/artifacts"
STATE_DIR = "/var/lib/nodewarm"
# containerd's version-2 name of the CRI plugin: AL2023's containerd 1.7 reads it as is; with containerd 2, nodeadm
# sees a version-2 setting, renders its version-2 template and runs `containerd config migrate`
# (amazon-eks-ami nodeadm/internal/containerd/config.go).
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
_HEREDOC_END = "NODEWARM_EOF"
_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def render_part(launch: BootstrapLaunch) -> str:
    """A MIME archive holding only nodewarm's parts: valid user data alone, or input to ``merge``."""
    parts = [Part(SHELL_SCRIPT, render_script(launch))]
    if launch.snapshot:
        parts.append(Part(NODE_CONFIG, render_nodeconfig()))
    return serialize(parts)


def render_script(launch: BootstrapLaunch) -> str:
    if launch.artifact_uri is None:
        raise UserDataInvalid("AL2023 user data fetches the nodewarm artifact: set BootstrapLaunch.artifact_uri "
                              "and artifact_sha256 to what `nodewarm package` printed")
    unit = _fill(_template("nodewarm-bootstrap.service"), CACHE_MOUNT=launch.cache_mount,
                 ARGV=" ".join(launch.bootstrap_argv()))
    # No region here: the launcher asks instance metadata, so the same user data fits every region.
    env = "\n".join([
        f"NODEWARM_ARTIFACT_URI={launch.artifact_uri}",
        f"NODEWARM_ARTIFACT_SHA256={launch.artifact_sha256}",
    ])
    embedded = {"ENV": env, "LAUNCH": _template("nodewarm-launch.sh").rstrip("\n"), "UNIT": unit.rstrip("\n")}
    _check_heredocs(embedded)
    script = _fill(_template("al2023-part.sh.tmpl"), MARKER=NODEWARM_MARKER, EOF=_HEREDOC_END,
                   SNAPSHOT=_snapshot_files(launch) if launch.snapshot else "", **embedded)
    if not script.isascii():
        # Karpenter labels shell parts charset="us-ascii".
        raise UserDataInvalid("the rendered AL2023 user data is not ASCII")
    return script


# Written by nodeadm on every AL2023 node (its containerd step) and named by its default runtime.
BASE_RUNTIME_SPEC = "/etc/containerd/base-runtime-spec.json"


def render_nodeconfig() -> str:
    """The NodeConfig part that adds the snapshot runtime to containerd (``spec.containerd.config``).

    nodeadm merges every NodeConfig part in order, and merges their containerd TOML key by key, so the user's own
    containerd settings and this one add up; Karpenter's NodeConfig, last, sets no containerd config. The runtime is
    the stock runc shim with nodewarm-runc as its runc, and what AL2023's own runc runtime has: its cgroup driver, and
    the base runtime spec nodeadm writes on every node (``BASE_RUNTIME_SPEC``: its rlimits, e.g. open files, which a
    serving pod needs as much on this runtime as on the stock one); no Root: the shim's default is runc's own state
    root (``RUNC_ROOT``), where the agent's checkpoint looks.
    Its first lines are comments, as Karpenter's own NodeConfig begins with one: the second is the marker
    ``merge`` knows nodewarm's parts by."""
    runtime = f"plugins.{json.dumps(CRI_PLUGIN)}.containerd.runtimes.{json.dumps(snapshot.RUNTIME_HANDLER)}"
    toml = "\n".join([
        f"[{runtime}]",
        'runtime_type = "io.containerd.runc.v2"',
        f"base_runtime_spec = {json.dumps(BASE_RUNTIME_SPEC)}",
        f"[{runtime}.options]",
        f"BinaryName = {json.dumps(snapshot.HANDLER_PATH)}",
        "SystemdCgroup = true",
    ])
    text = "\n".join([
        "# nodewarm: containerd's runtime for engine snapshots",
        NODEWARM_MARKER,
        "apiVersion: node.eks.aws/v1alpha1",
        "kind: NodeConfig",
        "spec:",
        "  containerd:",
        "    config: |",
        *(f"      {line}" for line in toml.split("\n")),
    ]) + "\n"
    if not text.isascii():
        raise UserDataInvalid("the rendered NodeConfig part is not ASCII")
    return text


def _snapshot_files(launch: BootstrapLaunch) -> str:
    """The part's lines that write the seccomp profile and nodewarm-runc (al2023-snapshot.sh.tmpl), each line ended.

    nodewarm-runc is told everything at render time, as the unit is: the artifact's handler entry by the pinned
    sha256, the store under the cache mount; it reads no file, as it runs for every runc call of those pods."""
    handler = _fill(
        _template("nodewarm-runc.sh"),
        HANDLER=shlex.quote(f"{ARTIFACTS_DIR}/{launch.artifact_sha256}/{HANDLER_ENTRY}"),
        LAUNCH_FAILURE=shlex.quote(f"{STATE_DIR}/{RECORD_FILE}"),
        ENV_RUNC=snapshot.ENV_RUNC, ENV_BOOT=snapshot.ENV_BOOT, ENV_CRIU=snapshot.ENV_CRIU,
        ENV_STORE=snapshot.ENV_STORE,
        CRIU=shlex.quote(snapshot.CRIU_PATH), STORE=shlex.quote(snapshot.store_dir(launch.cache_mount)),
    )
    seccomp_path = posixpath.join(snapshot.SECCOMP_DIR, snapshot.SECCOMP_PROFILE)
    embedded = {"SECCOMP": json.dumps(snapshot.SECCOMP, sort_keys=True), "HANDLER": handler.rstrip("\n")}
    _check_heredocs(embedded)
    return _fill(_template("al2023-snapshot.sh.tmpl"), EOF=_HEREDOC_END, SECCOMP_DIR=posixpath.dirname(seccomp_path),
                 SECCOMP_PATH=seccomp_path, HANDLER_PATH=snapshot.HANDLER_PATH, **embedded)


def _check_heredocs(embedded: dict[str, str]) -> None:
    for name, text in embedded.items():
        if _HEREDOC_END in text.split("\n"):
            raise UserDataInvalid(f"the {name} file contains the heredoc terminator {_HEREDOC_END}")


def _template(name: str) -> str:
    """A shipped file without its full-line comments: they explain the source here, and on the node they
    would only spend the 16 KB user-data budget that the user's own parts share (the shebang stays)."""
    text = resources.files(__package__).joinpath(name).read_text()
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.lstrip().startswith("#") or line.startswith("#!"))


def _fill(template: str, **values: str) -> str:
    """One pass, so a value that happens to contain @@NAME@@ is never expanded again."""
    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            raise UserDataInvalid(f"user-data template placeholder {match.group(0)} has no value")
        return values[match.group(1)]

    return _PLACEHOLDER.sub(value, template)
