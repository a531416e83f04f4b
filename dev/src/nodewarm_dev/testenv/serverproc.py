"""The lifetime of a local server's process, shared by the test servers that run one (s3server, registry)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class OwnsProcess:
    """For a server dataclass with the fields ``_proc`` (its process, None once stopped) and ``_log`` (the file
    its output goes to): read the log, stop it (SIGTERM, then SIGKILL after 10 s), and use it as a context manager."""

    _proc: subprocess.Popen | None
    _log: Path | None

    def log_text(self) -> str:
        return self._log.read_text(errors="replace") if self._log and self._log.exists() else ""

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
