"""The AL2023 user-data part that installs the nodewarm bootstrap as a systemd unit (pure rendering).

Why a unit and not inline work: cloud-init runs user-data scripts before ``nodeadm-run.service`` builds the
NVMe RAID at ``/mnt/k8s-disks/0`` and starts kubelet, and Karpenter deletes a node that has not registered
within 15 minutes. The part only writes three files and starts the unit with ``--no-block`` (blocking
would deadlock: nodeadm-run waits for cloud-final, which would wait for the unit, which waits for nodeadm-run).

How the code gets there: the unit runs ``nodewarm-launch``, which downloads the artifact built by
``nodewarm package`` with ``aws s3 cp`` (the EKS AL2023 AMI ships the AWS CLI v2, which signs with the
instance profile through IMDSv2), refuses it unless its sha256 is the one pinned here, unpacks it and runs
its ``bin/nodewarm``.
"""

from __future__ import annotations

import re
from importlib import resources

from .errors import UserDataInvalid
from .launch import BootstrapLaunch
from .mime import NODEWARM_MARKER, SHELL_SCRIPT, Part, serialize

UNIT_NAME = "nodewarm-bootstrap.service"
_HEREDOC_END = "NODEWARM_EOF"
_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def render_part(launch: BootstrapLaunch) -> str:
    """A MIME archive holding only nodewarm's shell part: valid user data alone, or input to ``merge``."""
    return serialize([Part(SHELL_SCRIPT, render_script(launch))])


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
    for name, text in embedded.items():
        if _HEREDOC_END in text.split("\n"):
            raise UserDataInvalid(f"the {name} file contains the heredoc terminator {_HEREDOC_END}")
    script = _fill(_template("al2023-part.sh.tmpl"), MARKER=NODEWARM_MARKER,
                   EOF=_HEREDOC_END, **embedded)
    if not script.isascii():
        # Karpenter labels shell parts charset="us-ascii".
        raise UserDataInvalid("the rendered AL2023 user data is not ASCII")
    return script


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
