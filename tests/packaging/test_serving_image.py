"""The serving image (deploy/images/serving/Containerfile), built for real by scripts/build-images.sh --only serving:
this machine's CPU vLLM (localhost/nodewarm-vllm-cpu, deploy/images/vllm-cpu: Debian bookworm and the serving
environment's wheels) with this checkout's nodewarm installed beside it.

What the rendered pods need from it, checked by running it with podman: nodewarm at the checkout's version in the
same python3 as vLLM; the engine the compile-cache key describes (torch, Triton and vLLM builds identical to the
serving environment the engine tests boot); the engine's packages untouched by installing nodewarm; the start
script's and the image pre-pull's commands present; nothing of dev/ or tests/ inside.

Needs root (see tests/packaging/test_images.py); FAILS with the reason otherwise. The first build takes ~8 min (the
Debian base with g++ ~45 s, the engine's wheels ~30 s, installing them ~4 min, committing ~3 GB); after that a
changed wheel rebuilds only nodewarm's layer.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
import yaml

from nodewarm import __version__, profile
from nodewarm.nodeclasses import servestart
from nodewarm.nodeclasses.prepull import NOOP
from nodewarm_dev.testenv import podrun
from support import images
from support.builders import v
from support.paths import REPO, package_files

pytestmark = [pytest.mark.slow, pytest.mark.realnode]

# The parts of the runtime probe (nodewarm.bootstrap.compilecache.cachekey.RuntimeProbe) that name the engine's
# builds. vllm_path and python_prefix are where it is installed, which an image decides (/opt/vllm here).
ENGINE_FIELDS = ("torch_version", "torch_build", "cuda", "triton", "triton_build", "vllm")
PROBE = ("import dataclasses, json; from nodewarm.bootstrap.compilecache.cachekey import probe_runtime; "
         "print(json.dumps(dataclasses.asdict(probe_runtime())))")


@pytest.fixture(scope="module")
def image() -> str:
    return images.serving_image()


def _engine_pins() -> dict[str, str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = lambda reqs, name: next(r for r in reqs if r.startswith(f"{name}==")).split("==", 1)[1]  # noqa: E731
    return {"vllm": pin(extras["serving"], "vllm"), "torch": pin(extras["torch"], "torch")}


def test_it_is_named_for_vllms_and_the_checkouts_versions_and_runs_its_nodewarm(image):
    # Named as the examples name it: vLLM's release, then nodewarm's.
    assert image == f"localhost/vllm-openai-nodewarm:v{_engine_pins()['vllm']}-{__version__}"
    labels = images.inspect(image)["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert re.fullmatch(r"[0-9a-f]{16}", labels["io.nodewarm.build-key"])
    assert images.ok_in_image(image, "nodewarm", "--version").strip() == f"nodewarm {__version__}"


def test_nodewarm_and_vllm_share_the_python3_the_pods_run(image):
    """The start script, the publisher and the engine check run `python3`/`nodewarm` from PATH: one interpreter,
    which imports vLLM, the Run:ai streamer and nodewarm."""
    script = ("import sys, vllm, runai_model_streamer, nodewarm, shutil; "
              "print(sys.executable, shutil.which('nodewarm'), vllm.__version__)")
    exe, nodewarm, vllm_version = images.ok_in_image(image, "python3", "-c", script, timeout=240).split()
    assert exe.startswith("/opt/vllm/bin/python3") and nodewarm == "/opt/vllm/bin/nodewarm", (exe, nodewarm)
    assert vllm_version == _engine_pins()["vllm"]


def test_its_engine_is_the_one_the_compile_cache_key_describes(image):
    """torch's build hash (every torch source file), Triton's and vLLM's, as the key records them: identical in the
    image and in the serving environment the engine tests boot, so a cache the tests publish is one this image
    may restore, and the other way round."""
    inside = json.loads(images.ok_in_image(image, "python3", "-c", PROBE, timeout=300).strip().splitlines()[-1])
    venv = podrun.require_serving_venv()
    here = subprocess.run([str(venv / "bin" / "python3"), "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stderr[-3000:]
    outside = json.loads(here.stdout.strip().splitlines()[-1])
    assert {f: inside[f] for f in ENGINE_FIELDS} == {f: outside[f] for f in ENGINE_FIELDS}
    assert inside["torch_version"].split("+")[0] == _engine_pins()["torch"]


def test_installing_nodewarm_changed_none_of_the_engines_packages(image):
    freeze = ["python3", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"]
    # The base build-images.sh makes for this machine's CPU vLLM, named for the vLLM release.
    base = images.ok_in_image(f"localhost/nodewarm-vllm-cpu:{_engine_pins()['vllm']}", *freeze).splitlines()
    served = images.ok_in_image(image, *freeze).splitlines()
    assert [ln for ln in served if not ln.startswith("nodewarm==")] == base
    assert f"nodewarm=={__version__}" in served


def test_the_commands_the_rendered_pods_name_are_there(image):
    """The image pre-pull's no-op and the vLLM container's interpreter (the start script is a ConfigMap)."""
    images.ok_in_image(image, *NOOP)
    assert servestart.command(profile.from_dict(v()))[0] == "python3"
    images.ok_in_image(image, "sh", "-c", "command -v python3 && command -v sh")


def test_nothing_of_dev_or_tests_is_inside(image):
    script = ("import importlib.util, json, os, nodewarm; d = os.path.dirname(nodewarm.__file__); "
              "print(json.dumps({'dev': importlib.util.find_spec('nodewarm_dev') is not None, "
              "'files': sorted(os.path.relpath(os.path.join(r, f), os.path.dirname(d)) for r, _, fs in os.walk(d) "
              "if '__pycache__' not in r for f in fs)}))")
    found = json.loads(images.ok_in_image(image, "python3", "-c", script))
    assert not found["dev"], "nodewarm_dev is importable in the serving image"
    assert set(found["files"]) == package_files(REPO / "src" / "nodewarm")


def test_the_examples_name_the_images_this_build_makes(image):
    """What a user copies names what `build-images.sh --push ... --push-serving ...` pushes: the nodewarm image for
    the agent, the serving image for the publisher, upstream's vLLM at the pinned release for the Deployment."""
    nodewarm = images.nodewarm_image()
    for path in sorted((REPO / "examples").glob("*.yaml")):
        p = profile.from_dict(yaml.safe_load(path.read_text()))
        assert p.serving.image == f"vllm/vllm-openai:v{_engine_pins()['vllm']}", path.name
        assert p.compile_cache.publisher.image.endswith("/" + image.split("/", 1)[1]), path.name
        if p.bootstrap.image:
            assert p.bootstrap.image.endswith("/" + nodewarm.split("/", 1)[1]), path.name
