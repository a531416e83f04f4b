"""The CPython the artifact carries: the interpreter `nodewarm package` runs on, less what a headless agent never uses.

Shipping the interpreter makes the node independent of its own Python: AL2023's python3 is 3.9, too old for
nodewarm and its dependencies (urllib3 2.8, kubernetes 37, boto3 and jsonschema require 3.10, nodewarm
itself 3.11), and installing a newer one at boot costs seconds and needs the package repositories.
The compiled packages in site/ were built for exactly this interpreter, so it is the one to carry.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import elf
from .errors import PackageError

PREFIX = "python"      # where the interpreter lives inside the artifact

# Never imported by a headless agent, and large (test/ alone is 120 MB). site-packages is this machine's
# own, never the agent's: the agent's packages travel in the artifact's site/.
_SKIP_TOP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "dist-packages"}
# Test suites nested in stdlib packages (unittest/test, ctypes/test, distutils/tests, ...).
_SKIP_ANY_DIR = {"__pycache__", "test", "tests", "idle_test"}
# Extension modules for a terminal or GUI, test helpers, and PEP 594 modules nothing here imports; besides
# being dead weight they link libraries a node may lack (libncursesw, libtk, libnsl, libcrypt.so.1).
# (_test* too: _testcapi, _testbuffer, ...)
_SKIP_EXTENSIONS = {"_tkinter", "_curses", "_curses_panel", "readline", "_ctypes_test", "_xxtestfuzz", "xxlimited",
                    "xxlimited_35", "nis", "_crypt", "spwd", "ossaudiodev"}


@dataclass(frozen=True)
class Interpreter:
    version: str                 # "3.11"
    prefix: Path                 # the base installation (not a virtual environment)
    executable: Path             # its bin/python3.X
    libpython: Path | None       # the shared libpython the executable loads; None for a static build
    stdlib: Path                 # below prefix: lib/python3.X, or lib64/ where built so (Fedora, AL2023)


def running() -> Interpreter:
    """The interpreter this process runs on, seen through any virtual environment."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    prefix = Path(sys.base_prefix)
    executable = prefix / "bin" / f"python{version}"
    stdlib = Path(sysconfig.get_path("stdlib"))
    dynload = Path(sysconfig.get_config_var("DESTSHARED"))
    for needed in (executable, stdlib / "os.py"):
        if not needed.is_file():
            raise PackageError(f"{needed} is missing: this Python ({prefix}) is not a complete installation; "
                               "package from a Python installed with its standard library")
    libpython = None
    soname = sysconfig.get_config_var("INSTSONAME")
    # The executable's own DT_NEEDED decides: Debian's python3.X reports a shared build (Py_ENABLE_SHARED)
    # yet has libpython linked in statically.
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and soname in elf.parse(executable.read_bytes()).needed:
        libpython = Path(sysconfig.get_config_var("LIBDIR")) / soname
        if not libpython.is_file():
            raise PackageError(f"{executable} loads {soname} but {libpython} is missing")
    if dynload.resolve().parent != stdlib.resolve() or not stdlib.is_relative_to(prefix):
        raise PackageError(f"this Python keeps its standard library in {stdlib} and extension modules in {dynload}; "
                           f"package from a Python with lib-dynload inside its standard library, under {prefix} "
                           "(pyenv, python.org, a distribution's /usr/bin/python3.X)")
    return Interpreter(version=version, prefix=prefix, executable=executable, libpython=libpython, stdlib=stdlib)


def wanted_dir(rel: PurePosixPath) -> bool:
    """Whether anything under the standard library directory ``rel`` (relative to lib/python3.X) is carried."""
    if rel.parts[0] in _SKIP_TOP or rel.parts[0].startswith("config-"):    # config-3.X-*: static lib, Makefile
        return False
    return not any(part in _SKIP_ANY_DIR for part in rel.parts)


def wanted(rel: PurePosixPath) -> bool:
    """Whether the standard library file at ``rel`` (relative to lib/python3.X) goes into the artifact."""
    if (len(rel.parts) > 1 and not wanted_dir(rel.parent)) or rel.suffix == ".pyc":
        return False
    if rel.parts[0] == "lib-dynload":
        module = rel.name.split(".", 1)[0]
        return module not in _SKIP_EXTENSIONS and not module.startswith("_test")
    return True


def files(interpreter: Interpreter) -> dict[str, Path]:
    """Artifact paths (under ``python/``) of the interpreter's files, laid out as its installation is so that
    ``python/bin/python3.X`` finds its standard library where it looks for it, without PYTHONHOME."""
    lib = f"{PREFIX}/{interpreter.stdlib.relative_to(interpreter.prefix).as_posix()}"
    out = {f"{PREFIX}/bin/python{interpreter.version}": interpreter.executable}
    # In python/lib whatever the build's libdir: that is where bin/nodewarm points LD_LIBRARY_PATH.
    if interpreter.libpython is not None:
        out[f"{PREFIX}/lib/{interpreter.libpython.name}"] = interpreter.libpython
    for top, dirs, names in os.walk(interpreter.stdlib):
        here = PurePosixPath(Path(top).relative_to(interpreter.stdlib).as_posix())
        # Pruned while walking: site-packages alone can hold hundreds of thousands of files.
        dirs[:] = [d for d in dirs if wanted_dir(here / d)]
        for name in names:
            path = Path(top) / name
            if wanted(here / name) and path.is_file():
                out[f"{lib}/{here / name}"] = path
    return out
