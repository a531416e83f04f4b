"""The ELF reader behind the artifact's glibc requirement, checked against binutils' readelf on real files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from nodewarm.userdata import elf
from nodewarm.userdata.errors import PackageError


def real_elf_files() -> list[Path]:
    """This interpreter, its libpython and extension modules, and a compiled dependency (Rust, C++ inside)."""
    base = Path(sys.base_prefix)
    files = [base / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        files.append(Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("INSTSONAME"))
    files += sorted(Path(sysconfig.get_config_var("DESTSHARED")).glob("*.so"))
    import cryptography.hazmat.bindings._rust as rust
    return files + [Path(rust.__file__)]


def readelf(path: Path) -> tuple[tuple[str, ...], str | None, dict[str, tuple[str, ...]]]:
    """DT_NEEDED, DT_SONAME and version needs (file -> names) as binutils' readelf prints them."""
    out = subprocess.run(["readelf", "-d", "-V", "--wide", str(path)], capture_output=True, text=True,
                         check=True).stdout
    needed = tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*?)\]", out))
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.*?)\]", out)
    versions: dict[str, list[str]] = {}
    if ".gnu.version_r" in out:
        current = None
        for line in out.split(".gnu.version_r", 1)[1].splitlines():
            if m := re.search(r"File: (\S+)", line):
                current = versions.setdefault(m.group(1), [])
            elif (m := re.search(r"Name: (\S+)\s+Flags", line)) and current is not None:
                current.append(m.group(1))
    return needed, soname.group(1) if soname else None, {k: tuple(v) for k, v in versions.items()}


def test_needs_match_readelf_on_every_binary_of_this_python():
    assert shutil.which("readelf"), "binutils (readelf) is the oracle for this test"
    files = real_elf_files()
    assert len(files) > 20
    for path in files:
        got = elf.parse(path.read_bytes(), str(path))
        needed, soname, versions = readelf(path)
        assert (got.needed, got.soname) == (needed, soname), path
        assert {k: sorted(v) for k, v in got.versions.items()} == {k: sorted(v) for k, v in versions.items()}, path


def test_glibc_versions_compare_as_numbers_and_ignore_other_libraries():
    assert elf.glibc_version("GLIBC_2.2.5") == (2, 2)
    assert elf.glibc_version("GLIBC_PRIVATE") is None and elf.glibc_version("GLIBCXX_3.4.29") is None
    assert elf.glibc_version("GLIBC_ABI_DT_RELR") == (2, 36)
    names = ["GLIBC_2.9", "GLIBC_2.17", "GLIBC_2.3.4", "OPENSSL_3.0.0", "GCC_4.2.0", "GLIBC_PRIVATE"]
    assert elf.highest_glibc(names) == (2, 17)                       # 17 > 9: not string order
    assert elf.highest_glibc(["OPENSSL_3.0.0"]) is None


def test_node_needs_are_what_the_files_do_not_bring_themselves():
    files = {
        "python/bin/python3.11": elf.ElfNeeds(None, ("libpython3.11.so.1.0", "libc.so.6"),
                                              {"libc.so.6": ("GLIBC_2.2.5", "GLIBC_2.34")}),
        "python/lib/libpython3.11.so.1.0": elf.ElfNeeds("libpython3.11.so.1.0", ("libm.so.6", "libc.so.6"),
                                                        {"libm.so.6": ("GLIBC_2.35",), "libc.so.6": ("GLIBC_2.14",)}),
        "site/x/_ssl.so": elf.ElfNeeds(None, ("libssl.so.3", "libc.so.6"),
                                       {"libssl.so.3": ("OPENSSL_3.0.0",), "libc.so.6": ("GLIBC_2.2.5",)}),
        "site/y.libs/libbundled-1a2b.so.1": elf.ElfNeeds("libbundled.so.1", (), {}),
        "site/y/_ext.so": elf.ElfNeeds(None, ("libbundled.so.1", "libbz2.so.1.0"), {}),
    }
    needs = elf.node_needs(files)
    assert needs.glibc == (2, 35)
    assert needs.libraries == {"libbz2.so.1.0": (), "libc.so.6": (), "libm.so.6": (), "libssl.so.3": ("OPENSSL_3.0.0",)}


def test_a_file_that_is_not_elf_or_has_no_section_headers_is_refused():
    with pytest.raises(PackageError, match="not an ELF file"):
        elf.parse(b"#!/bin/sh\n" + b"\0" * 64, "script")
    header = bytearray(Path(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
                       .read_bytes()[:64])
    header[0x28:0x30] = b"\0" * 8                                    # e_shoff = 0 (64-bit little-endian)
    with pytest.raises(PackageError, match="no section headers"):
        elf.parse(bytes(header), "stripped")
