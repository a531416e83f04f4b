"""`nodewarm package`: the artifact AL2023 nodes fetch — nodewarm, its dependencies and the Python they run on.

Layout: ``bin/nodewarm`` (runs ``python/bin/python3.X -I -S`` with ``site/`` first on sys.path),
``bin/snapshot-handler`` (the engine snapshots' runtime handler, run the same way without bin/nodewarm's checks:
it runs for every runc call of the snapshot RuntimeClass's pods, see al2023.py),
``python/`` (the CPython this runs on: interpreter, shared libpython, standard library with lib-dynload;
see interpreter.py), ``site/`` (nodewarm and every distribution it requires, exactly as installed here) and
``manifest.json``. It is taken from this environment rather than resolved anew so the node runs the
versions that were tested, and nothing is installed on the node at boot. The binaries inside are specific
to this CPU architecture and link against this machine's glibc: the launcher checks the node's architecture
and glibc against what the manifest records (elf.py reads the requirement from the files themselves).
The tar.gz is reproducible: same environment, same bytes, same sha256 — the sha256 the user data pins.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from nodewarm import logs
from . import elf, interpreter
from .errors import PackageError

log = logs.get("userdata.package")

# Not part of a wheel built from a checkout: version control, build output, caches.
_SOURCE_IGNORE_NAMES = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                              "out", "results", "node_modules")


def _source_ignore(folder: str, names: list[str]) -> set[str]:
    """What the wheel's copy of a checkout leaves out: the names above and every virtual environment, whatever it
    is called (a checkout holds .venv, .venv-serving, .venv-floors: gigabytes, ~80,000 files, that made each
    package build spend over a minute copying them)."""
    return set(_SOURCE_IGNORE_NAMES(folder, names)) | {
        n for n in names if os.path.isfile(os.path.join(folder, n, "pyvenv.cfg"))}
# Amazon Linux 2023 ships glibc 2.34: an artifact needing more cannot start on its nodes.
AL2023_GLIBC = (2, 34)
GLIBC_FIX = ("AL2023 nodes (glibc 2.34) will refuse this artifact: run nodewarm package on AL2023, e.g. in an "
             "amazonlinux:2023 container, or on another machine whose glibc is at most the nodes'")


@dataclass(frozen=True)
class Artifact:
    path: Path
    sha256: str
    size: int
    python: str
    arch: str
    glibc: str                         # the lowest glibc the node may have, e.g. "2.34"
    distributions: dict[str, str]


def requirement_closure(root: str, extras: Iterable[str], requires_of: Callable[[str], list[str] | None]) -> list[str]:
    """Canonical names of ``root`` and everything it needs (with ``extras``), in first-seen order.

    ``requires_of(name)`` gives a distribution's Requires-Dist lines, or None when it is not installed.
    Markers are evaluated for this interpreter, each with the extras it was asked for.
    """
    order: list[str] = []
    pending = [(canonicalize_name(root), frozenset(extras), root)]
    while pending:
        name, wanted, asked_by = pending.pop(0)
        if name in order:
            continue
        requires = requires_of(name)
        if requires is None:
            raise PackageError(f"{name} (required by {asked_by}) is not installed in this Python; install "
                               f"nodewarm with its dependencies (pip install nodewarm) and package again")
        order.append(name)
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                pending.append((canonicalize_name(req.name), frozenset(req.extras), name))
    return order


def artifact_name(version: str, python: str, arch: str, sha256: str) -> str:
    """Content-addressed: a new build never overwrites an object that running nodes may be fetching."""
    return f"nodewarm-{version}-py{python.replace('.', '')}-{arch}-{sha256[:12]}.tar.gz"


# The artifact's runtime handler entry: the node's nodewarm-runc script runs it (al2023.py).
HANDLER_ENTRY = "bin/snapshot-handler"


def launcher(python: str, arch: str, glibc: str) -> str:
    text = resources.files(__package__).joinpath("artifact-launcher.sh.tmpl").read_text()
    text = text.replace("@@EXEC_PYTHON@@", _exec_python(python, "nodewarm.cli"))
    return text.replace("@@ARCH@@", arch).replace("@@GLIBC@@", glibc)


def handler_entry(python: str) -> str:
    text = resources.files(__package__).joinpath("artifact-handler.sh.tmpl").read_text()
    return text.replace("@@EXEC_PYTHON@@", _exec_python(python, "nodewarm.bootstrap.snapshot.handler"))


def _exec_python(python: str, module: str) -> str:
    """The shell lines every entry of the artifact ends with: ``module``'s ``main(argv)`` on the artifact's CPython,
    seeing only its standard library and ``site/`` (-I -S), with the entry's arguments; ``$root`` is the artifact.

    No PYTHONHOME: -I ignores it, and the interpreter finds its standard library (python/lib/python3.X, or lib64/
    if it was built so) from where its own executable is. LD_LIBRARY_PATH brings in only the artifact's
    libpython, ahead of the RUNPATH of the build machine's prefix."""
    return (f'LD_LIBRARY_PATH="$root/python/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
            f'exec "$root/python/bin/python{python}" -I -S \\\n'
            f"  -c 'import sys; sys.path[:0] = [sys.argv.pop(1)]; from {module} import main; "
            f"sys.exit(main(sys.argv[1:]))' \\\n"
            f'  "$root/site" "$@"')


def glibc_requirement(needs: elf.NodeNeeds) -> str:
    if needs.glibc is None:
        raise PackageError("this Python and its extension modules require no glibc symbol version; nodewarm "
                           "package supports glibc-linked CPython builds only (pyenv, python.org, a distribution's)")
    return "%d.%d" % needs.glibc


def exceeds_al2023(glibc: str) -> bool:
    return tuple(int(p) for p in glibc.split(".")) > AL2023_GLIBC


def build(output_dir: Path, extras: Iterable[str] = ()) -> Artifact:
    """Write the artifact into ``output_dir`` and return where it is and its sha256."""
    names = requirement_closure("nodewarm", extras, _installed_requires)
    runtime = interpreter.running()
    python = runtime.version
    with tempfile.TemporaryDirectory(prefix="nodewarm-package-") as tmp:
        files: dict[str, Path] = {}
        versions: dict[str, str] = {}
        for name in names:
            dist = _installed(name)
            versions[dist.metadata["Name"]] = dist.version
            found = _wheel_files(dist, Path(tmp)) if _editable(dist) else _installed_files(dist)
            files.update({f"site/{rel}": path for rel, path in found.items()})
        pth = sorted(a for a in files if a.endswith(".pth"))
        if pth:
            raise PackageError(f"{', '.join(pth)}: .pth files do not run under the node's `python -S`; package "
                               "from an environment without the distributions that ship them")
        files.update(interpreter.files(runtime))
        needs = elf.node_needs(_elf_needs(files))
        glibc = glibc_requirement(needs)
        arch = platform.machine()
        manifest = {"name": "nodewarm", "version": versions["nodewarm"], "python": python, "arch": arch,
                    "glibc": glibc, "system_libraries": {k: list(v) for k, v in needs.libraries.items()},
                    "distributions": dict(sorted(versions.items()))}
        extra = {"bin/nodewarm": (launcher(python, arch, glibc).encode(), 0o755),
                 HANDLER_ENTRY: (handler_entry(python).encode(), 0o755),
                 "manifest.json": (json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n", 0o644)}
        output_dir.mkdir(parents=True, exist_ok=True)
        partial = output_dir / ".nodewarm-artifact.partial"
        _write_tar(partial, files, extra)
        sha = _sha256(partial)
        final = output_dir / artifact_name(versions["nodewarm"], python, arch, sha)
        partial.replace(final)
    log.info("package.built", path=str(final), sha256=sha, distributions=len(versions), arch=arch, python=python,
             glibc=glibc)
    if exceeds_al2023(glibc):
        log.warning("package.glibc_above_al2023", glibc=glibc, fix=GLIBC_FIX)
    return Artifact(path=final, sha256=sha, size=final.stat().st_size, python=python, arch=arch, glibc=glibc,
                    distributions=manifest["distributions"])


def _installed(name: str) -> metadata.Distribution:
    """The installed distribution, not a source tree's ``*.egg-info`` that shadows it when the current
    directory is a checkout (an editable install leaves one there, and it has neither RECORD nor
    direct_url.json)."""
    found = list(metadata.distributions(name=name))
    for dist in found:
        if dist.read_text("RECORD") is not None:
            return dist
    if not found:
        raise metadata.PackageNotFoundError(name)
    return found[0]


def _installed_requires(name: str) -> list[str] | None:
    try:
        return _installed(name).requires or []
    except metadata.PackageNotFoundError:
        return None


def _editable(dist: metadata.Distribution) -> bool:
    direct = dist.read_text("direct_url.json")
    return bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))


def _installed_files(dist: metadata.Distribution) -> dict[str, Path]:
    """The distribution's files under its site-packages (scripts in bin/ and caches are left out)."""
    if dist.files is None:
        raise PackageError(f"{dist.metadata['Name']} has no RECORD of its files; reinstall it with pip")
    site = Path(dist.locate_file("")).resolve()
    found = {}
    for entry in dist.files:
        path = Path(dist.locate_file(entry)).resolve()
        if "__pycache__" in entry.parts or entry.suffix == ".pyc" or not path.is_relative_to(site):
            continue
        found[path.relative_to(site).as_posix()] = path
    return found


def _wheel_files(dist: metadata.Distribution, tmp: Path) -> dict[str, Path]:
    """An editable install points at a checkout: build the wheel pip would install and take its files."""
    source = Path(json.loads(dist.read_text("direct_url.json"))["url"].removeprefix("file://"))
    # Built from a copy so the checkout gets no build/ directory and concurrent builds cannot collide.
    tree = tmp / "source"
    shutil.copytree(source, tree, ignore=_source_ignore)
    wheels = tmp / "wheel"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", str(wheels), str(tree)],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        raise PackageError(f"building the nodewarm wheel from {source} failed: {run.stderr.strip()[-2000:]}")
    unpacked = tmp / "unpacked"
    shutil.unpack_archive(next(wheels.glob("*.whl")), unpacked, format="zip")
    return {p.relative_to(unpacked).as_posix(): p for p in unpacked.rglob("*") if p.is_file()}


def _elf_needs(files: dict[str, Path]) -> dict[str, elf.ElfNeeds]:
    """Every ELF file among ``files`` (the interpreter, libpython, extension modules, bundled libraries)."""
    out = {}
    for arcname, path in files.items():
        with open(path, "rb") as f:
            if elf.is_elf(f.read(4)):
                f.seek(0)
                out[arcname] = elf.parse(f.read(), str(path))
    return out


def _write_tar(path: Path, files: dict[str, Path], extra: dict[str, tuple[bytes, int]]) -> None:
    """Sorted entries, zero mtimes, root owner, normalised modes, no name in the gzip header: reproducible."""
    members = sorted({**files, **extra}.items(), key=lambda member: member[0])
    dirs = sorted({p for a, _ in members for p in _parents(a)})
    with open(path, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in dirs:
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755, 0))
        for arcname, source in members:
            if isinstance(source, Path):
                mode = 0o755 if os.access(source, os.X_OK) else 0o644
                with open(source, "rb") as f:
                    tar.addfile(_info(arcname, tarfile.REGTYPE, mode, source.stat().st_size), f)
            else:
                blob, mode = source
                tar.addfile(_info(arcname, tarfile.REGTYPE, mode, len(blob)), io.BytesIO(blob))


def _parents(arcname: str) -> list[str]:
    parts = arcname.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
