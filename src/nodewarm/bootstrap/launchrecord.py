"""What went wrong before the agent could start, as the launchers left it for the agent to report.

nodewarm-launch (artifact fetch, sha256, unpack) and the artifact's bin/nodewarm (architecture, glibc)
fail before any Python of ours runs, so they cannot set the Node condition; they write
``$NODEWARM_STATE_DIR/launch-failure`` instead (``key=value`` lines, a blank line, the message) and the
agent reports it with the node's identity when it next starts. A record is removed once reported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nodewarm import logs

log = logs.get("bootstrap.launchrecord")

RECORD_FILE = "launch-failure"
MAX_MESSAGE = 4000


@dataclass(frozen=True)
class LaunchFailure:
    reason: str   # CamelCase, as the launcher named it (ArtifactFetchFailed, ArtifactRejected...)
    status: int   # the launcher's exit status
    time: str     # when it failed, RFC 3339 UTC
    message: str

    def condition_message(self) -> str:
        return (f"the nodewarm launcher failed at {self.time} (exit {self.status}) before the agent started: "
                f"{self.message}")

    def annotation(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def parse(text: str) -> LaunchFailure:
    """A record's text as a LaunchFailure (pure); a damaged record still yields what it says."""
    head, _, body = text.partition("\n\n")
    fields = dict(line.partition("=")[::2] for line in head.splitlines() if "=" in line)
    try:
        status = int(fields.get("status", ""))
    except ValueError:
        status = -1
    reason = fields.get("reason", "")
    if not (reason.isascii() and reason.isalnum() and reason[:1].isupper()):
        reason = "LaunchFailed"
    message = " ".join(body.split())[:MAX_MESSAGE] or "(no message)"
    return LaunchFailure(reason, status, fields.get("time", "unknown time"), message)


def read(state_dir: Path) -> LaunchFailure | None:
    try:
        text = (state_dir / RECORD_FILE).read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("launch.record_unreadable", path=str(state_dir / RECORD_FILE), error=str(e))
        return None
    return parse(text)


def clear(state_dir: Path) -> None:
    (state_dir / RECORD_FILE).unlink(missing_ok=True)
