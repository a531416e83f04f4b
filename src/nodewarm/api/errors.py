"""The one exception family the CLI turns into a clear one-line message and a non-zero exit."""

from __future__ import annotations


class NodewarmError(Exception):
    """A failure a user or operator can act on.

    ``reason`` is a short CamelCase code (it also becomes a Node condition or Event reason, e.g.
    ``InsufficientNVMe``); the message says what happened, which field or file, and the fix.
    """

    reason = "Failed"
    exit_code = 1

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason:
            self.reason = reason

    def one_line(self) -> str:
        return f"{self.reason}: {' '.join(str(self).split())}"


class ProfileError(NodewarmError):
    """A WarmProfile that cannot work: names the field, the bad value and the fix."""

    reason = "InvalidProfile"
    exit_code = 2

    def __init__(self, field: str, value, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}: {value!r} is not valid: {fix}")
