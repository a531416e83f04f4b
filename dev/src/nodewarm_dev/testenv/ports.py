"""Free loopback ports and readiness polling for the local servers."""

from __future__ import annotations

import socket
import time
from typing import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (bind to 0, read it back, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, proc=None) -> None:
    """Poll `check` until it returns True; fail with `what` (and the process's exit code) on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with code {proc.returncode} before it was ready")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not ready after {timeout_s:.0f}s")
