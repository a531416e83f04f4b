"""A node's compile-cache folders as the compile-cache tests lay them out: the vLLM root and Inductor's, side by side
under one node folder, filled with the files a compile would leave."""

from __future__ import annotations

from pathlib import Path


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def node_roots(tmp_path: Path, name: str, vllm: dict[str, bytes] | None = None,
               inductor: dict[str, bytes] | None = None) -> dict[str, Path]:
    """Node ``name``'s cache roots, holding ``vllm`` and ``inductor`` (relative path -> bytes) when given."""
    roots = {"vllm": tmp_path / name / "vllm/torch_compile_cache", "inductor": tmp_path / name / "inductor"}
    write_tree(roots["vllm"], vllm or {})
    write_tree(roots["inductor"], inductor or {})
    return roots
