"""nodewarm's images of this checkout, built by scripts/build-images.sh (buildah, the rootful image store): one home
for the builds the image tests and the real-node tests share. The first build of `nodewarm` takes ~2 min, of the
serving image ~8 min (its CPU vLLM base); after that the script finds an image up to date in seconds unless the
wheel changed (then the serving image rebuilds only its nodewarm layer)."""

from __future__ import annotations

import functools
import json
import os
import subprocess

from support.paths import REPO

SCRIPT = REPO / "scripts" / "build-images.sh"
BUILD_TIMEOUT_S = 1500


def build(*args: str) -> subprocess.CompletedProcess:
    """Run the script; fails (never skips) without root, which buildah's rootful store and apt-get need."""
    assert os.geteuid() == 0, (
        f"the image tests need root (uid {os.geteuid()}): scripts/build-images.sh installs buildah/podman/mmdebstrap "
        "with apt-get and builds in the rootful image store")
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)


def _built(which: str) -> str:
    r = build("--only", which)
    assert r.returncode == 0, f"scripts/build-images.sh --only {which} failed (exit {r.returncode}):\n{r.stderr[-6000:]}"
    return r.stdout.split()[-1]


@functools.cache
def nodewarm_image() -> str:
    """The `nodewarm` image's local reference (``localhost/nodewarm:VERSION``), built once per test session."""
    return _built("nodewarm")


@functools.cache
def serving_image() -> str:
    """The serving image's local reference (``localhost/vllm-openai-nodewarm:vVLLM-VERSION``: this machine's CPU vLLM
    with nodewarm), built once per test session."""
    return _built("serving")


# --- looking at an image ------------------------------------------------------------------------------------------

def run(cmd: list[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def ok(cmd: list[str], timeout: float = 180, **kw) -> str:
    r = run(cmd, timeout, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def inspect(image: str) -> dict:
    (doc,) = json.loads(ok(["podman", "image", "inspect", image]))
    return doc


def in_image(image: str, *argv: str, user: str | int | None = None, mounts: tuple[str, ...] = (),
             timeout: float = 120) -> subprocess.CompletedProcess:
    """argv in a throwaway container as a pod runs it: read-only root filesystem, every capability dropped, no
    privilege escalation, no network; as ``user`` (default: the image's)."""
    cmd = ["podman", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "all",
           "--security-opt", "no-new-privileges"]
    if user is not None:
        cmd += ["--user", str(user)]
    for m in mounts:
        cmd += ["-v", m]
    return run([*cmd, image, *argv], timeout)


def ok_in_image(image: str, *argv: str, **kw) -> str:
    r = in_image(image, *argv, **kw)
    assert r.returncode == 0, f"{' '.join(argv)} in {image} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout
