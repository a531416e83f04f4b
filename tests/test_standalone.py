"""The checkout stands alone: no tracked file reads or cites a path outside it, and every relative link in the
Markdown resolves to a file inside it. A clone anywhere has nothing beside it (scripts/check-standalone.sh runs the
README's first command in such a clone); this catches the reference before anyone has to run that."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Built from parts so this file does not match itself.
SHARED = "shared" + "/"
FORBIDDEN = [
    (re.compile(re.escape(SHARED)), "a path into a folder beside the checkout"),
    (re.compile(r"""parents?\b[^\n]{0,40}/\s*["']""" + "shared" + r"""["']"""),
     "a folder found beside the checkout"),
    (re.compile(r"/" + r"work/(?:main|shared)\b"), "this machine's absolute checkout path"),
    (re.compile(r"karpenter-" + r"semantics\.md|reference/(?:testenv|compile-cache)\.md"),
     "a reference note that is not in the repository (its facts live under docs/)"),
]
# CI's entry point is the one file that may name the folder CI keeps beside the clone: the issue that asked for the
# strict check has .ci/run point NODEWARM_CRDS_DIR there when it exists. Nothing the product, its tests or the
# demo run reads it.
EXEMPT = {".ci/run"}
# What a clone never holds: build outputs and environments (.gitignore), whose files are not the project's words.
IGNORED_DIRS = {".git", ".venv", ".venv-floors", ".venv-serving", "__pycache__", "build", "dist", ".pytest_cache",
                "out", "results", ".whl", ".gl"}


def tracked_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
        return [REPO / n for n in names.decode().split("\0") if n and (REPO / n).is_file()]
    except (OSError, subprocess.CalledProcessError):       # a copy without .git: every file outside the ignored dirs
        return [p for p in REPO.rglob("*") if p.is_file()
                and not IGNORED_DIRS.intersection(p.relative_to(REPO).parts)
                and not any(part.endswith(".egg-info") for part in p.parts)]


def text_of(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def outside_references(files: list[Path], root: Path = REPO) -> list[str]:
    hits = []
    for f in files:
        text = text_of(f)
        if text is None:
            continue
        for pattern, why in FORBIDDEN:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{f.relative_to(root)}:{line}: {why}: {text.splitlines()[line - 1].strip()[:120]}")
    return hits


def test_no_tracked_file_reads_or_cites_a_path_outside_the_checkout():
    files = tracked_files()
    assert len(files) > 100, "the tree was not found"
    hits = outside_references([f for f in files if str(f.relative_to(REPO)) not in EXEMPT])
    assert not hits, "write the fact under docs/ in the project's own words and point there:\n" + "\n".join(hits)


def test_the_check_finds_each_kind_of_outside_reference(tmp_path):
    samples = {
        "a.py": 'CRDS = REPO_ROOT.parent / "' + 'shared" / "crds"\n',
        "b.sh": "# Recipe: ../" + SHARED + "reference/build.md\n",
        "c.md": "see " + "karpenter-" + "semantics.md §c\n",
        "d.py": 'ROOT = "/' + 'work/main/src"\n',
    }
    for name, text in samples.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "clean.md").write_text("see [testing](docs/testing.md), /usr/share/doc and DESTSHARED\n")
    hits = outside_references([tmp_path / n for n in [*samples, "clean.md"]], tmp_path)
    assert {h.split(":", 1)[0] for h in hits} == set(samples), hits


MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_links(files: list[Path]) -> list[tuple[Path, str]]:
    out = []
    for f in files:
        if f.suffix == ".md":
            text = text_of(f) or ""
            text = re.sub(r"```.*?```", "", text, flags=re.S)       # code blocks hold examples, not links
            out += [(f, m.group(1)) for m in MD_LINK.finditer(text)]
    return out


def broken_links(links: list[tuple[Path, str]], root: Path) -> list[str]:
    bad = []
    for f, target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue                                   # a URL, or an anchor in the same page
        path = target.split("#", 1)[0]
        resolved = (f.parent / path).resolve()
        if not resolved.is_relative_to(root):
            bad.append(f"{f.relative_to(root)}: {target} leaves the checkout")
        elif not resolved.exists():
            bad.append(f"{f.relative_to(root)}: {target} does not exist")
    return bad


def test_every_relative_link_in_the_docs_resolves_inside_the_checkout():
    links = markdown_links(tracked_files())
    assert links, "no Markdown links found"
    bad = broken_links(links, REPO)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("target, ok", [("docs/testing.md", True), ("../outside.md", False), ("docs/nope.md", False),
                                        ("https://example.com/x", True), ("#anchor", True)])
def test_the_link_check_can_fail(tmp_path, target, ok):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "testing.md").write_text("x")
    page = tmp_path / "README.md"
    page.write_text(f"see [it]({target})\n")
    assert (broken_links(markdown_links([page]), tmp_path.resolve()) == []) is ok
