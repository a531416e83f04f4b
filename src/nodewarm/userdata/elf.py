"""What an ELF file needs from the dynamic loader: the libraries it names and the symbol versions it requires.

The node runs binaries built elsewhere, so the artifact has to say which glibc it needs. The symbol versions
are read from the ELF version-needs section (``.gnu.version_r``, the table ``readelf -V`` prints), not by
scanning ``.dynstr`` for ``GLIBC_`` strings: ``.dynstr`` also holds versions a library *defines* and names
that are not versions at all, while version-needs holds exactly what the loader checks before it runs the
file. Only section headers are read; a file stripped of them (rare, ``sstrip``) is refused rather than guessed.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .errors import PackageError

MAGIC = b"\x7fELF"

_SHT_DYNAMIC = 6
_SHT_GNU_VERNEED = 0x6FFFFFFE
_DT_NULL, _DT_NEEDED, _DT_SONAME = 0, 1, 14
_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.\d+)?$")
# Not numbered, but only a glibc of at least this version defines it: binaries linked with
# -z pack-relative-relocs need GLIBC_ABI_DT_RELR, which appeared in glibc 2.36.
_GLIBC_MARKERS = {"GLIBC_ABI_DT_RELR": (2, 36)}


@dataclass(frozen=True)
class ElfNeeds:
    soname: str | None
    needed: tuple[str, ...]                          # DT_NEEDED, in file order
    versions: dict[str, tuple[str, ...]]             # needed file -> the symbol versions required from it


@dataclass(frozen=True)
class _Layout:
    endian: str
    word: str      # struct code of an address-sized field


class _Section(NamedTuple):
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


def is_elf(head: bytes) -> bool:
    return head[:4] == MAGIC


def parse(data: bytes, name: str = "<elf>") -> ElfNeeds:
    """The dynamic needs of the ELF file ``data`` (``name`` only labels errors)."""
    if not is_elf(data) or len(data) < 64:
        raise PackageError(f"{name}: not an ELF file")
    if data[4] not in (1, 2) or data[5] not in (1, 2):
        raise PackageError(f"{name}: unknown ELF class {data[4]} or byte order {data[5]}")
    layout = _Layout(endian="<" if data[5] == 1 else ">", word="I" if data[4] == 1 else "Q")
    sections = _sections(data, layout, name)
    soname, needed = None, []
    versions: dict[str, tuple[str, ...]] = {}
    for section in sections:
        strtab = sections[section.link]
        if section.type == _SHT_DYNAMIC:
            for tag, value in _dynamic(data, layout, section):
                if tag == _DT_NEEDED:
                    needed.append(_string(data, strtab, value))
                elif tag == _DT_SONAME:
                    soname = _string(data, strtab, value)
        elif section.type == _SHT_GNU_VERNEED:
            versions.update(_verneed(data, layout.endian, section, strtab))
    return ElfNeeds(soname=soname, needed=tuple(needed), versions=versions)


def glibc_version(name: str) -> tuple[int, int] | None:
    """The glibc release that introduced symbol version ``name`` (GLIBC_2.34 -> (2, 34)), None if not glibc's.

    GLIBC_PRIVATE is left out: only glibc's own libraries use it, always from the same installation.
    """
    match = _GLIBC.match(name)
    if match:
        return int(match.group(1)), int(match.group(2))
    return _GLIBC_MARKERS.get(name)


def highest_glibc(names: Iterable[str]) -> tuple[int, int] | None:
    found = [v for v in map(glibc_version, names) if v is not None]
    return max(found) if found else None


def _sections(data: bytes, layout: _Layout, name: str) -> list[_Section]:
    e, w = layout.endian, layout.word
    shoff = struct.unpack_from(f"{e}{w}", data, 0x28 if w == "Q" else 0x20)[0]
    shentsize, shnum = struct.unpack_from(f"{e}HH", data, 0x3A if w == "Q" else 0x2E)
    if shoff == 0 or shnum == 0:
        raise PackageError(f"{name}: the ELF file has no section headers; its needs cannot be read")
    header = struct.Struct(f"{e}II{w}{w}{w}{w}II{w}{w}")
    out = []
    for i in range(shnum):
        _, sh_type, _, _, offset, size, link, info, _, entsize = header.unpack_from(data, shoff + i * shentsize)
        out.append(_Section(sh_type, offset, size, link, info, entsize))
    return out


def _dynamic(data: bytes, layout: _Layout, section: _Section):
    entry = struct.Struct(f"{layout.endian}{'q' if layout.word == 'Q' else 'i'}{layout.word}")
    for at in range(section.offset, section.offset + section.size, section.entsize or entry.size):
        tag, value = entry.unpack_from(data, at)
        if tag == _DT_NULL:
            return
        yield tag, value


def _verneed(data: bytes, endian: str, section: _Section, strtab: _Section) -> dict[str, tuple[str, ...]]:
    """Elf_Verneed entries (one per needed file) each followed by its Elf_Vernaux chain (one per version);
    both are 16 bytes in 32- and 64-bit files, linked by offsets relative to the current entry."""
    out: dict[str, tuple[str, ...]] = {}
    at = section.offset
    for _ in range(section.info):     # sh_info: the number of Elf_Verneed entries
        _, cnt, file, aux, nxt = struct.unpack_from(f"{endian}HHIII", data, at)
        names, aux_at = [], at + aux
        for _ in range(cnt):
            _, _, _, vna_name, vna_next = struct.unpack_from(f"{endian}IHHII", data, aux_at)
            names.append(_string(data, strtab, vna_name))
            aux_at += vna_next
        out[_string(data, strtab, file)] = tuple(names)
        if nxt == 0:
            break
        at += nxt
    return out


def _string(data: bytes, strtab: _Section, index: int) -> str:
    start = strtab.offset + index
    return data[start:data.index(b"\0", start)].decode()


@dataclass(frozen=True)
class NodeNeeds:
    """What a set of ELF files, installed together, needs from the machine that runs them."""

    glibc: tuple[int, int] | None                    # the highest GLIBC_x.y any of them requires
    # soname not among the files -> the symbol versions required from it, less glibc's (``glibc`` sums those up)
    libraries: dict[str, tuple[str, ...]]


def node_needs(files: dict[str, ElfNeeds]) -> NodeNeeds:
    """``files`` maps each file's path (its last component is its name) to its needs."""
    provided = {path.rsplit("/", 1)[-1] for path in files} | {n.soname for n in files.values() if n.soname}
    libraries: dict[str, set[str]] = {}
    for needs in files.values():
        for soname in needs.needed:
            if soname not in provided:
                wanted = (v for v in needs.versions.get(soname, ()) if glibc_version(v) is None)
                libraries.setdefault(soname, set()).update(wanted)
    every = (v for needs in files.values() for names in needs.versions.values() for v in names)
    return NodeNeeds(glibc=highest_glibc(every),
                     libraries={name: tuple(sorted(v)) for name, v in sorted(libraries.items())})
