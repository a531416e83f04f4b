"""How runc and CRIU are run for a snapshot: which binaries, and the environment that points runc at this CRIU
and CRIU at the store's options. One home for both the checkpoint and the handler's restore."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tools:
    runc: str          # the real runc (never the handler: it would call itself)
    criu: str
    criu_config: Path

    def env(self) -> dict[str, str]:
        # runc finds CRIU on PATH (runc 1.1 also takes --criu; 1.2 dropped it), and CRIU reads CRIU_CONFIG_FILE in
        # the swrk mode runc starts it in.
        env = dict(os.environ)
        env["PATH"] = f"{Path(self.criu).parent}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        env["CRIU_CONFIG_FILE"] = str(self.criu_config)
        return env

    def runc_cmd(self, global_args: tuple[str, ...] | list[str], *args: str) -> list[str]:
        return [self.runc, *global_args, *args]

    def run(self, cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env(), timeout=timeout, **kw)


def log_tail(path: Path, lines: int = 6) -> str:
    """The last error lines of a CRIU log (what a refusal quotes)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in text if "Error" in line or "error" in line]
    return " | ".join(s.strip() for s in (errors or text)[-lines:])
