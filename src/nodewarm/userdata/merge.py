"""Merge nodewarm's part into a user's existing AL2023 user data, once, and account for EC2's 16 KB limit.

Karpenter renders custom parts first, in order, then appends its own NodeConfig (cluster endpoint, CA
bundle, kubelet config, labels, taints); EC2 rejects the whole launch template above 16384 decoded bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from .errors import UserDataInvalid, UserDataNotMime, UserDataTooLarge
from .mime import NODE_CONFIG, SHELL_SCRIPT, Part, looks_like_mime, parse, serialize

USER_DATA_LIMIT = 16384
# Karpenter's generated NodeConfig part: the base64 CA bundle is ~1.5 KB, cluster name and endpoint, the
# kubelet config, --node-labels and registerWithTaints the rest. 3 KB keeps a margin over what we have seen.
KARPENTER_NODECONFIG_RESERVE = 3072
_NOT_YAML = object()


@dataclass(frozen=True)
class MergeResult:
    """``user_data`` goes into EC2NodeClass.spec.userData. ``added`` is False when it already held our part
    verbatim (nothing changed: no drift). ``bytes_used`` counts Karpenter's NodeConfig reserve too."""

    user_data: str
    added: bool
    bytes_used: int
    budget_left: int


def merge(existing: str | None, ours_part: str, reserve: int = KARPENTER_NODECONFIG_RESERVE) -> MergeResult:
    """Keep the user's parts and their order, replace an older nodewarm part where it stood, else append ours."""
    ours = parse(ours_part)
    if not ours or not all(p.is_nodewarm for p in ours):
        raise UserDataInvalid("merge: ours_part must be the archive render_part returned (nodewarm parts only)")
    parts = _existing_parts(existing)
    index = next((i for i, p in enumerate(parts) if p.is_nodewarm), None)
    if index is None:
        merged = parts + ours
    else:
        merged = parts[:index] + ours + [p for p in parts[index + 1:] if not p.is_nodewarm]
    rendered = serialize(merged)
    added = merged != parts
    # Unchanged: hand back the user's own bytes. Re-serializing could still change the text (headers,
    # boundary), and any change to userData drifts every node of the EC2NodeClass.
    user_data = existing if not added and existing is not None and looks_like_mime(existing) else rendered
    used = len(rendered.encode()) + reserve
    if used > USER_DATA_LIMIT:
        own = len(serialize(ours).encode())
        raise UserDataTooLarge(
            f"user data would be about {used} bytes (nodewarm {own}, yours {used - own - reserve}, Karpenter's "
            f"NodeConfig ~{reserve}), over EC2's {USER_DATA_LIMIT}-byte limit: move large scripts or files out "
            "of the EC2NodeClass userData (fetch them at boot) and render again"
        )
    return MergeResult(user_data=user_data, added=added, bytes_used=used, budget_left=USER_DATA_LIMIT - used)


def _existing_parts(existing: str | None) -> list[Part]:
    if existing is None or not existing.strip():
        return []
    if looks_like_mime(existing):
        return parse(existing)
    return [_wrap_plain(existing.replace("\r", ""))]


def _wrap_plain(text: str) -> Part:
    """Label plain user data as Karpenter would, but refuse where that label contradicts what it is.

    Karpenter labels anything that YAML-parses into a map, or into nothing (a comments-only script), as a
    NodeConfig, and everything else as a shell script. Wrapping it ourselves makes the label explicit.
    """
    doc = _first_yaml_doc(text)
    karpenter_label = NODE_CONFIG if doc is None or isinstance(doc, dict) else SHELL_SCRIPT
    if text.startswith("#!"):
        intended = SHELL_SCRIPT
    elif isinstance(doc, dict) and doc.get("kind") == "NodeConfig":
        intended = NODE_CONFIG
    else:
        raise UserDataNotMime(
            "the existing userData is neither a MIME archive, a script starting with #!, nor a NodeConfig; "
            "Karpenter would pass it on as " + karpenter_label + ". Add a #! line if it is a script, or wrap it "
            'in a MIME part with the right Content-Type (multipart/mixed; boundary="//") and render again'
        )
    if intended != karpenter_label:
        raise UserDataNotMime(
            "the existing userData is a shell script, but it parses as YAML (or holds only comments), so "
            f"Karpenter would label it {NODE_CONFIG} and nodeadm would reject it; wrap it in a MIME part "
            f"with Content-Type: {SHELL_SCRIPT} and render again"
        )
    return Part(intended, text)


def _first_yaml_doc(text: str):
    """What sigs.k8s.io/yaml sees: the first document, or a marker when it is not YAML at all."""
    try:
        return next(iter(yaml.safe_load_all(text)), None)
    except yaml.YAMLError:
        return _NOT_YAML
