"""MIME multipart user data, read and written the way Karpenter's AL2023 (nodeadm) family does.

Karpenter re-serializes custom user data: it keeps each part's Content-Type and body, drops every other
header, writes boundary ``//`` and strips carriage returns (karpenter-provider-aws
``bootstrap/mime/mime.go``). Writing the same bytes lets the size we report be the size EC2 will see.
"""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass

from .errors import UserDataInvalid, UserDataNotMime

BOUNDARY = "//"
SHELL_SCRIPT = 'text/x-shellscript; charset="us-ascii"'
NODE_CONFIG = "application/node.eks.aws"
# Second line of every part nodewarm writes (after a script's shebang, after a NodeConfig's first comment): how a
# later merge recognises (and replaces) its own parts instead of adding them again.
NODEWARM_MARKER = "# nodewarm-userdata-part"


@dataclass(frozen=True)
class Part:
    content_type: str
    content: str

    @property
    def is_nodewarm(self) -> bool:
        lines = self.content.split("\n", 2)
        return len(lines) > 1 and lines[1].startswith(NODEWARM_MARKER)


def looks_like_mime(text: str) -> bool:
    """Karpenter's own test (nodeadm.go): anything else is taken as a NodeConfig or a shell script."""
    head = text.strip()
    return head.startswith("MIME-Version:") or head.startswith("Content-Type:")


def parse(text: str) -> list[Part]:
    """The parts of a MIME multipart archive, as Karpenter will pass them on, in order."""
    msg = email.message_from_string(text.replace("\r\n", "\n"), policy=email.policy.compat32)
    if not msg.is_multipart():
        raise UserDataNotMime(
            f"user data has MIME headers but Content-Type {msg.get('Content-Type')!r} is not multipart with a "
            "boundary; Karpenter only accepts multipart/mixed archives: wrap the part in "
            f'`Content-Type: multipart/mixed; boundary="{BOUNDARY}"`'
        )
    parts = []
    for index, sub in enumerate(msg.get_payload(), start=1):
        if sub.is_multipart():
            raise UserDataNotMime(f"user data part {index} is itself multipart; flatten it into the outer archive")
        content_type = sub.get("Content-Type")
        if not content_type:
            raise UserDataNotMime(f"user data part {index} has no Content-Type header; cloud-init cannot run it")
        encoding = (sub.get("Content-Transfer-Encoding") or "7bit").strip().lower()
        if encoding == "quoted-printable":
            # Go's multipart reader decodes quoted-printable itself, so Karpenter passes the plain text on.
            body = sub.get_payload(decode=True).decode(sub.get_content_charset() or "utf-8")
        elif encoding in ("7bit", "8bit", "binary"):
            body = sub.get_payload()
        else:
            raise UserDataInvalid(
                f"user data part {index} uses Content-Transfer-Encoding {encoding}: Karpenter keeps only the "
                "Content-Type header, so the node would receive the encoded text; include the part in plain text"
            )
        parts.append(Part(" ".join(str(content_type).split()), body))
    return parts


def serialize(parts: list[Part]) -> str:
    """Byte for byte what Go's multipart.Writer emits with Karpenter's boundary, carriage returns removed."""
    out = [f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n']
    for index, part in enumerate(parts):
        content = part.content.replace("\r", "")
        if f"\n--{BOUNDARY}" in f"\n{content}":
            raise UserDataInvalid(
                f"user data part {index + 1} contains a line starting with --{BOUNDARY}, Karpenter's MIME "
                "boundary: it would split the part; change that line"
            )
        lead = "\n" if index else ""
        out.append(f"{lead}--{BOUNDARY}\nContent-Type: {part.content_type}\n\n{content}")
    out.append(f"\n--{BOUNDARY}--\n")
    return "".join(out)
