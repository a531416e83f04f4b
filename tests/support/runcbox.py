"""Real runc containers for the snapshot tests: a static counter in a minimal root filesystem, run straight by
runc under a private state root (no containerd, no kubelet), checkpointed and restored with the CRIU setup built.

The counter keeps two counts: one in its own memory and one in a MAP_SHARED file in /dev/shm (given as a bind
mount, as Kubernetes gives a pod's). It writes both, with a random token drawn at start, to /out/state every 50 ms, so a test
reads whether a process is the same one (its token), went on from where it was (its counts), and found its
/dev/shm as it left it.
"""

from __future__ import annotations

import json
import os
import threading
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nodewarm.api import snapshot

COUNTER_C = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef AMX
#include <immintrin.h>
struct tilecfg { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
#endif
int main(void) {
  unsigned token = 0; int r = open("/dev/urandom", O_RDONLY); read(r, &token, sizeof token); close(r);
  int fd = open("/dev/shm/nw-counter", O_RDWR | O_CREAT, 0600); ftruncate(fd, 4096);
  volatile long *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  long n = 0;
#ifdef AMX
  /* As oneDNN does before its AMX kernels: ask for tile data (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 3;
  struct tilecfg cfg = {0}; cfg.palette = 1; cfg.rows[0] = 16; cfg.colsb[0] = 64;
#endif
  for (;;) {
#ifdef AMX
    _tile_loadconfig(&cfg); _tile_zero(0); _tile_release();
#endif
    n++; shared[0]++;
    FILE *f = fopen("/out/state.tmp", "w");
    if (f) { fprintf(f, "%08x %ld %ld\n", token, n, shared[0]); fclose(f); rename("/out/state.tmp", "/out/state"); }
    usleep(50000);
  }
}
"""


class PodLog:
    """A pipe standing for the shim's: what a container (and the handler, on its create) writes to stdout and
    stderr, drained into ``path``. CRIU saves a pipe as an external end and runc hands the restoring process's
    stdio to it, as on a real node; a plain file there would be a file CRIU cannot find in the container."""

    def __init__(self, path: Path):
        self.path = path
        self.read_fd, self.write_fd = os.pipe()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        with open(self.path, "ab", buffering=0) as out:
            while chunk := os.read(self.read_fd, 65536):
                out.write(chunk)

    def close_writer(self):
        """Our copy of the writing end: the container (and a restored one) keeps its own."""
        os.close(self.write_fd)

    def text(self, containing: str = "", timeout: float = 5) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.path.read_text() if self.path.exists() else ""
            if containing in text or time.monotonic() > deadline:
                return text
            time.sleep(0.05)


@dataclass
class Container:
    id: str
    bundle: Path
    out: Path
    shm: Path

    def state(self, timeout: float = 10) -> tuple[str, int, int]:
        """(token, own count, /dev/shm count) once the counter has written them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                token, n, shared = (self.out / "state").read_text().split()
                return token, int(n), int(shared)
            except (OSError, ValueError):
                time.sleep(0.05)
        raise AssertionError(f"the counter of {self.id} wrote no state in {timeout}s")

    def wait_count(self, at_least: int, timeout: float = 10) -> tuple[str, int, int]:
        deadline = time.monotonic() + timeout
        while True:
            s = self.state(timeout)
            if s[1] >= at_least or time.monotonic() > deadline:
                return s
            time.sleep(0.05)


class Runc:
    """Containers under one private runc root, each with its own bundle, /out and /dev/shm directories."""

    def __init__(self, base: Path, rootfs: Path):
        self.base, self.rootfs = base, rootfs
        self.root = base / "runc-root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ids: list[str] = []

    def bundle(self, name: str = "srv", env: dict[str, str] | None = None, rootfs: Path | None = None) -> Container:
        cid = f"nwtest-{uuid.uuid4().hex[:10]}"
        b = self.base / cid
        (b / "out").mkdir(parents=True)
        (b / "shm").mkdir()
        subprocess.run(["runc", "spec", "--bundle", str(b)], check=True)
        config = json.loads((b / "config.json").read_text())
        config["process"]["terminal"] = False
        config["process"]["args"] = ["/counter"]
        config["process"]["env"] += [f"{k}={v}" for k, v in (env or {}).items()] + [f"HOSTNAME={cid}"]
        config["root"] = {"path": str(rootfs or self.rootfs), "readonly": True}
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/dev/shm"] + [
            {"destination": "/dev/shm", "type": "bind", "source": str(b / "shm"), "options": ["rbind", "rw"]},
            {"destination": "/out", "type": "bind", "source": str(b / "out"), "options": ["rbind", "rw"]},
        ]
        config["annotations"] = {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": name,
            "io.kubernetes.cri.sandbox-name": f"pod-{cid}",
            "io.kubernetes.cri.sandbox-namespace": "serving",
            "io.kubernetes.cri.image-name": "registry.local/counter:1",
        }
        (b / "config.json").write_text(json.dumps(config))
        self.ids.append(cid)
        return Container(cid, b, b / "out", b / "shm")

    def create_argv(self, c: Container) -> list[str]:
        """The create as containerd's shim writes it."""
        return ["--root", str(self.root), "--log", str(c.bundle / "log.json"), "--log-format", "json",
                "create", "--bundle", str(c.bundle), "--pid-file", str(c.bundle / "init.pid"), c.id]

    def status(self, cid: str) -> str:
        out = subprocess.run(["runc", "--root", str(self.root), "state", cid], capture_output=True, text=True)
        return json.loads(out.stdout)["status"] if out.returncode == 0 else "absent"

    def cleanup(self) -> None:
        for cid in self.ids:
            subprocess.run(["runc", "--root", str(self.root), "delete", "--force", cid], capture_output=True)


def handler(store, criu: str, argv: list[str], stdio: int | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The snapshot handler as containerd's shim runs it: on a create, stdout and stderr are the container's log
    pipe. ``env``: more settings (api.snapshot's ENV_*)."""
    env = {**os.environ, snapshot.ENV_RUNC: "runc", snapshot.ENV_CRIU: criu, snapshot.ENV_STORE: str(store.root),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "nodewarm.bootstrap.snapshot.handler", *argv], env=env,
                          stdin=subprocess.DEVNULL, stdout=stdio, stderr=stdio, timeout=180)


def create_and_start(runc: "Runc", store, criu: str, c: Container) -> str:
    """Create and start ``c`` through the handler; the pod's log once the handler has said what it did."""
    log = PodLog(c.bundle / "pod.log")
    created = handler(store, criu, runc.create_argv(c), log.write_fd)
    log.close_writer()
    assert created.returncode == 0, log.text()
    assert handler(store, criu, ["--root", str(runc.root), "start", c.id]).returncode == 0
    return log.text("nodewarm snapshot:")


def counter_rootfs(base: Path, amx: bool = False) -> Path:
    """A root filesystem holding only the static counter, built with gcc -static (the image's one layer). With
    ``amx``, the counter also runs an AMX tile instruction each round, as a CPU engine's bf16 kernels do."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "counter.c").write_text(COUNTER_C)
    root = base / "rootfs"
    for d in ("out", "dev/shm", "proc", "sys", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    flags = ["-DAMX", "-mamx-tile"] if amx else []
    subprocess.run(["gcc", "-static", "-O2", *flags, "-o", str(root / "counter"), str(base / "counter.c")],
                   check=True)
    return root


def cpu_has_amx() -> bool:
    return " amx_tile" in Path("/proc/cpuinfo").read_text()


def counter_image(base: Path) -> str:
    """The counter as an image in buildah's local store (from scratch: its root filesystem, entrypoint /counter);
    returns its local name."""
    root = counter_rootfs(base)
    ctr = subprocess.run(["buildah", "from", "scratch"], check=True, capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["buildah", "copy", "--quiet", ctr, f"{root}/", "/"], check=True, capture_output=True)
        subprocess.run(["buildah", "config", "--entrypoint", '["/counter"]', ctr], check=True, capture_output=True)
        name = "localhost/nwtest-counter:1"
        subprocess.run(["buildah", "commit", "--quiet", ctr, name], check=True, capture_output=True)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    return name
