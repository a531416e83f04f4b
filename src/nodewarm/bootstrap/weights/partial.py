"""A file still being pulled, on disk: its preallocated temp file and the journal of the parts already in it.

The pull writes them (s3pull.py) and resumes from them; a peer serves the journaled parts to other nodes
(peers/openrange.py). The journal's first line is a JSON header naming the object version and the part layout
({"key", "etag", "version_id", "size", "part_size", "part_digest"}); each later line is "<part> <digest hex>\\n",
written after that part's bytes. A line a crash tore has no newline and is ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PARTIAL_DIR = ".nodewarm/partial"
PART_SUFFIX, JOURNAL_SUFFIX = ".part", ".part.journal"
_JOURNAL_LINE = re.compile(r"(\d+) ([0-9a-f]{8,64})\n")


def partial_paths(dest: Path, rel_path: str) -> tuple[Path, Path]:
    temp = dest / PARTIAL_DIR / (rel_path + PART_SUFFIX)
    return temp, temp.with_name(temp.name + ".journal")


def partial_rel_path(name: str) -> str | None:
    """The model file a name under PARTIAL_DIR belongs to (None: not one of ours)."""
    for suffix in (JOURNAL_SUFFIX, PART_SUFFIX):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return None


def parse_journal(lines: list[str]) -> tuple[dict, dict[int, bytes]] | None:
    """A journal's header and its parts (index -> digest); None when the header line is torn or not an object."""
    if not lines or not lines[0].endswith("\n"):
        return None
    try:
        header = json.loads(lines[0])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    return header, {int(m[1]): bytes.fromhex(m[2]) for line in lines[1:] if (m := _JOURNAL_LINE.fullmatch(line))}
