"""The `nodewarm` image of this checkout, built by scripts/build-images.sh (buildah, the rootful image store): one
home for the build the image tests and the real-node tests share. The first build takes ~2 min; after that the script
finds the image up to date in seconds unless the wheel changed."""

from __future__ import annotations

import functools
import os
import subprocess

from support.paths import REPO

SCRIPT = REPO / "scripts" / "build-images.sh"
BUILD_TIMEOUT_S = 1500


def build() -> subprocess.CompletedProcess:
    """Run the script; fails (never skips) without root, which buildah's rootful store and apt-get need."""
    assert os.geteuid() == 0, (
        f"the image tests need root (uid {os.geteuid()}): scripts/build-images.sh installs buildah/podman/mmdebstrap "
        "with apt-get and builds in the rootful image store")
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)


@functools.cache
def nodewarm_image() -> str:
    """The image's local reference (``localhost/nodewarm:VERSION``), built once per test session."""
    r = build()
    assert r.returncode == 0, f"scripts/build-images.sh failed (exit {r.returncode}):\n{r.stderr[-6000:]}"
    return r.stdout.split()[-1]
