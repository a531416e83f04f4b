"""The ways rendering user data or packaging the node artifact can fail, each with an actionable reason."""

from __future__ import annotations

from nodewarm.api.errors import NodewarmError


class UserDataTooLarge(NodewarmError):
    """EC2 rejects user data over 16384 bytes (decoded), Karpenter's own parts included."""

    reason = "UserDataTooLarge"


class UserDataNotMime(NodewarmError):
    """Existing user data that Karpenter would mislabel or cannot parse as a MIME multipart archive."""

    reason = "UserDataNotMime"


class UserDataInvalid(NodewarmError):
    """A launch setting or a user-data part that would break on the node (unsafe characters, bad encoding)."""

    reason = "UserDataInvalid"
    exit_code = 2


class PackageError(NodewarmError):
    """The node artifact cannot be built from this environment."""

    reason = "PackageFailed"
