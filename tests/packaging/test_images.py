"""The `nodewarm` image (deploy/images/nodewarm/Containerfile), built for real by scripts/build-images.sh: buildah on
the local Debian bookworm base (mmdebstrap), this checkout's wheel and its dependencies from PyPI, no torch, no vLLM.

What the pods need from it, checked by running it with podman the way they run it: the commands the controller
Deployment and the agent DaemonSet start (taken from their renderers, not retyped here) under their users with a
read-only root filesystem and no capability; the version; every nodewarm module importing; nothing of dev/ or
tests/ inside; the non-root default user; and the round trip through a real registry on 127.0.0.1 (Debian's
docker-registry, nodewarm_dev.testenv.registry) into an empty image store.

Needs root (the script installs buildah, podman, mmdebstrap and docker-registry with apt-get and builds in the rootful
store). Where that is not possible every test here FAILS with the reason: a skipped image test would hide an image
that does not build. The first build takes ~2 min (the base ~45 s, resolving the dependency wheels, the image ~40 s);
after that the script finds the image up to date in ~2 s unless the wheel changed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import tomllib

import pytest

from nodewarm import __version__
from nodewarm.controller.manifests import deployment
from nodewarm.userdata.daemonset import manifests as daemonset_manifests
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm_dev.testenv import registry as registry_server
from support import images
from support.paths import REPO, package_files

pytestmark = [pytest.mark.slow, pytest.mark.realnode]

# Uncompressed, as `podman image inspect` counts it: ~360 MB today (the Debian base ~106 MB, kubernetes 37 with its
# asyncio client ~128 MB). torch alone would be several times this: the budget catches a dependency that pulls it in.
SIZE_BUDGET = 500 * 1000 * 1000


@pytest.fixture(scope="module")
def image() -> str:
    return images.nodewarm_image()


def _container(doc: dict) -> dict:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def _controller() -> dict:
    return deployment("IMAGE")


def _agent() -> dict:
    launch = BootstrapLaunch(profile="p", cache_mount="/mnt/.ephemeral")
    docs = daemonset_manifests(launch, nodepool="gpu", image="IMAGE", readiness_taint_key="nodewarm.io/warming")
    return next(d for d in docs if d["kind"] == "DaemonSet")


def _subcommand(container: dict) -> list[str]:
    """The pod's command and its leading sub-command words (up to the first option): e.g. nodewarm bootstrap run."""
    argv = [*container["command"], *container.get("args", [])]
    words = []
    for a in argv:
        if a.startswith("-"):
            break
        words.append(a)
    return words


def _run_as(doc: dict) -> int | None:
    pod, container = doc["spec"]["template"]["spec"], _container(doc)
    return container.get("securityContext", {}).get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))


# --- the build -------------------------------------------------------------------------------------------------------

def test_the_image_is_named_for_the_checkouts_version(image):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert project == __version__, f"pyproject.toml says {project}, nodewarm/__init__.py says {__version__}"
    assert image == f"localhost/nodewarm:{__version__}"
    labels = images.inspect(image)["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert re.fullmatch(r"[0-9a-f]{16}", labels["io.nodewarm.build-key"])


def test_a_second_run_finds_it_up_to_date(image):
    before = images.inspect(image)["Id"]
    again = images.build("--only", "nodewarm")
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.split()[-1] == image
    assert "is up to date" in again.stderr, f"the unchanged checkout was built again:\n{again.stderr[-3000:]}"
    assert images.inspect(image)["Id"] == before


def test_it_stays_small(image):
    size = images.inspect(image)["Size"]
    assert size < SIZE_BUDGET, f"{image} is {size / 1e6:.0f} MB, over its {SIZE_BUDGET / 1e6:.0f} MB budget"


# --- what runs inside ------------------------------------------------------------------------------------------------

def test_its_entrypoint_reports_the_checkouts_version(image):
    assert images.ok_in_image(image, "nodewarm", "--version").strip() == f"nodewarm {__version__}"


@pytest.mark.parametrize("pod", ["controller", "agent"])
def test_the_command_each_pod_runs_starts_as_that_pod_runs_it(image, pod):
    """The Deployment's `nodewarm controller` as 65532 and the DaemonSet's `nodewarm bootstrap run` as root, each
    read-only and without capabilities: --help parses its flags and imports its command's modules."""
    doc = _controller() if pod == "controller" else _agent()
    argv = _subcommand(_container(doc))
    assert argv[0] == "nodewarm" and len(argv) > 1, argv
    out = images.ok_in_image(image, *argv, "--help", user=_run_as(doc))
    assert out.startswith(f"usage: {' '.join(argv)}"), out[:500]


def test_the_agent_finds_nodewarm_and_python3_on_path(image):
    """nodewarm.userdata.daemonset: the image must have `nodewarm` and `python3` on PATH."""
    out = images.ok_in_image(image, "sh", "-c", "command -v nodewarm && command -v python3 && python3 --version", user=0)
    nodewarm, python3, version = out.split("\n")[:3]
    assert nodewarm == "/opt/nodewarm/bin/nodewarm" and python3 == "/opt/nodewarm/bin/python3", out
    assert re.match(r"Python 3\.(1[1-9]|[2-9]\d)\.", version), version


def test_every_top_level_command_registers(image):
    out = images.ok_in_image(image, "nodewarm", "--help")
    for command in ("render", "bootstrap", "publish", "engine-check", "controller", "package", "status"):
        assert re.search(rf"^\s+{re.escape(command)}\b", out, re.M), f"`{command}` missing from nodewarm --help:\n{out}"
    assert not re.search(r"^\s+demo\b", out, re.M), "nodewarm-dev's `demo` command is in the image"


IMPORT_ALL = """
import importlib, json, pkgutil, sys
import nodewarm
names = sorted(m.name for m in pkgutil.walk_packages(nodewarm.__path__, "nodewarm."))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
heavy = sorted(m for m in ("torch", "vllm", "triton", "runai_model_streamer") if m in sys.modules)
print(json.dumps({"modules": len(names), "failed": failed, "heavy": heavy}))
"""


def test_every_nodewarm_module_imports_without_torch(image):
    """torch and vLLM are imported only inside the functions that need them (the serving image's publisher and
    engine check): every module of the package imports here, and none of them loads either."""
    result = json.loads(images.ok_in_image(image, "python3", "-c", IMPORT_ALL))
    assert result["modules"] > 100, result
    assert not result["failed"], f"modules that do not import in the image: {result['failed']}"
    assert not result["heavy"], f"importing nodewarm loaded {result['heavy']}"


DEPENDENCIES = """
import importlib.metadata as md, importlib.util, json
from packaging.requirements import Requirement
problems = []
for line in md.requires("nodewarm") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    try:
        v = md.version(r.name)
    except md.PackageNotFoundError:
        problems.append(f"{r.name}: not installed")
        continue
    if not r.specifier.contains(v, prereleases=True):
        problems.append(f"{r.name} {v} not in {r.specifier}")
absent = ["torch", "vllm", "triton", "runai_model_streamer", "nodewarm_dev", "pip", "setuptools"]
present = [m for m in absent if importlib.util.find_spec(m) is not None]
print(json.dumps({"problems": problems, "present": present}))
"""


def test_its_dependencies_are_the_wheels_and_nothing_heavy(image):
    result = json.loads(images.ok_in_image(image, "python3", "-c", DEPENDENCIES))
    assert not result["problems"], f"nodewarm's requirements not met in the image: {result['problems']}"
    assert not result["present"], f"in the image and not meant to be: {result['present']}"


CONTENTS = """
import json, os, sysconfig
from importlib.metadata import distributions, entry_points
site = sysconfig.get_paths()["purelib"]
pkg = os.path.join(site, "nodewarm")
files = sorted(os.path.relpath(os.path.join(d, f), site) for d, dirs, fs in os.walk(pkg)
               if "__pycache__" not in d.split(os.sep) for f in fs)
print(json.dumps({"top": sorted(os.listdir(site)), "nodewarm": files,
                  "dists": sorted(d.metadata["Name"] for d in distributions()),
                  "plugins": sorted(ep.name for ep in entry_points(group="nodewarm.commands"))}))
"""


def test_nothing_of_dev_or_tests_is_inside(image):
    found = json.loads(images.ok_in_image(image, "python3", "-c", CONTENTS))
    banned = {"nodewarm_dev", "tests", "support", "bench", "demo", "testenv", "conftest.py"}
    assert not banned & set(found["top"]), f"in site-packages: {sorted(banned & set(found['top']))}"
    assert not [d for d in found["dists"] if d.lower().replace("_", "-") == "nodewarm-dev"], found["dists"]
    assert found["plugins"] == [], f"nodewarm.commands plugins in the image: {found['plugins']}"
    # The installed package is src/nodewarm, all of it and nothing else.
    assert set(found["nodewarm"]) == package_files(REPO / "src" / "nodewarm"), (
        f"only in the image: {sorted(set(found['nodewarm']) - package_files(REPO / 'src' / 'nodewarm'))}; "
        f"only in src/: {sorted(package_files(REPO / 'src' / 'nodewarm') - set(found['nodewarm']))}")


# --- users -----------------------------------------------------------------------------------------------------------

def test_the_default_user_is_the_controllers_non_root_user(image):
    controller = _run_as(_controller())
    assert controller == 65532 and _controller()["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]
    assert images.inspect(image)["Config"]["User"] == f"{controller}:{controller}"
    assert images.ok_in_image(image, "id", "-u").strip() == str(controller)
    assert images.ok_in_image(image, "sh", "-c", "echo $HOME").strip() == "/home/nonroot"


def test_the_agent_runs_as_root_because_it_writes_under_the_hostpath(image, tmp_path):
    """The DaemonSet sets runAsUser 0 itself (the image's default is non-root): as root, with every capability
    dropped, it writes under a root-owned NVMe mount, which the image's default user cannot."""
    assert _run_as(_agent()) == 0
    mount = tmp_path / "nvme"
    mount.mkdir(mode=0o755)
    volume = f"{mount}:/mnt/.ephemeral"
    images.ok_in_image(image, "sh", "-c", "mkdir /mnt/.ephemeral/models && echo ok > /mnt/.ephemeral/models/f",
                 user=0, mounts=(volume,))
    assert (mount / "models" / "f").read_text() == "ok\n"
    denied = images.in_image(image, "sh", "-c", "touch /mnt/.ephemeral/x", mounts=(volume,))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied


# --- the registry round trip -----------------------------------------------------------------------------------------

@pytest.fixture
def registry(tmp_path):
    server = registry_server.start(tmp_path / "registry")
    yield server
    server.stop()


def test_it_pushes_to_a_registry_and_pulls_back_into_an_empty_store(image, registry, tmp_path):
    remote = f"{registry.host}/nodewarm:{__version__}"
    images.ok(["buildah", "push", "--quiet", "--tls-verify=false", image, f"docker://{remote}"], 300)
    assert registry.get("/v2/_catalog")[1] == {"repositories": ["nodewarm"]}
    assert registry.get("/v2/nodewarm/tags/list")[1]["tags"] == [__version__]
    if shutil.which("skopeo"):
        inspected = json.loads(images.ok(["skopeo", "inspect", "--tls-verify=false", f"docker://{remote}"]))
        assert inspected["Labels"]["org.opencontainers.image.version"] == __version__
    # A store of its own, empty, with vfs (no overlay mounts left behind): every layer comes over the wire. podman
    # refuses a runroot path longer than 50 characters: that one is a short folder of its own under /tmp.
    runroot = tempfile.mkdtemp(prefix="nw-run-", dir="/tmp")
    store = ["podman", "--root", str(tmp_path / "store"), "--runroot", runroot, "--storage-driver", "vfs"]
    try:
        pulled = images.ok([*store, "pull", "--quiet", "--tls-verify=false", remote], 300).strip()
        assert pulled == images.inspect(image)["Id"], "the pulled image is not the one pushed"
        out = images.ok([*store, "run", "--rm", "--network", "none", remote, "nodewarm", "--version"])
        assert out.strip() == f"nodewarm {__version__}"
    finally:
        images.run([*store, "rmi", "--all", "--force"])
        shutil.rmtree(runroot, ignore_errors=True)
