"""A real OCI image registry on 127.0.0.1 for the image tests: Debian's ``docker-registry`` (the CNCF
Distribution registry, v2 API) over a folder of the caller's, plain HTTP, no auth.

Clients reach it as an insecure registry: ``buildah push --tls-verify=false IMAGE docker://HOST/name:tag``,
``podman pull --tls-verify=false HOST/name:tag``, ``skopeo inspect --tls-verify=false docker://HOST/name:tag``.
The binary comes from the Debian package ``docker-registry`` (scripts/build-images.sh installs it with the other
image tools).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port, wait_until
from .serverproc import OwnsProcess

BINARY = "docker-registry"


@dataclass
class Registry(OwnsProcess):
    """A running registry. ``host`` is ``127.0.0.1:PORT`` (what image references start with), ``url`` its HTTP
    root, ``root`` the folder its blobs and manifests are stored in."""

    host: str
    root: Path
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: Path | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def get(self, path: str) -> tuple[int, dict]:
        """GET a v2 API path (``/v2/_catalog``, ``/v2/NAME/tags/list``): the status and the JSON body."""
        req = urllib.request.Request(self.url + path, headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")


def _binary() -> str:
    found = shutil.which(BINARY) or (f"/usr/bin/{BINARY}" if Path(f"/usr/bin/{BINARY}").exists() else None)
    if not found:
        raise RuntimeError(f"{BINARY!r} not found: install the Debian package docker-registry "
                           "(bash scripts/build-images.sh installs it)")
    return found


def start(tmpdir: str | Path, timeout_s: float = 30) -> Registry:
    """Start a registry storing under ``tmpdir/storage`` on a free loopback port; wait until ``/v2/`` answers."""
    tmp = Path(tmpdir)
    root = tmp / "storage"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host = f"127.0.0.1:{port}"
    # YAML is a superset of JSON: the config is written with json, no YAML writer needed.
    config = tmp / "config.yml"
    config.write_text(json.dumps({
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root)}, "delete": {"enabled": True}},
        "http": {"addr": host, "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }, indent=1))
    log = tmp / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([_binary(), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    registry = Registry(host=host, root=root, _proc=proc, _log=log)
    try:
        wait_until(lambda: registry.get("/v2/")[0] == 200, timeout_s, "docker-registry", proc)
    except Exception as e:
        registry.stop()
        raise RuntimeError(f"{e}\n--- docker-registry log ---\n{registry.log_text()[-3000:]}") from None
    return registry
