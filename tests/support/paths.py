"""The checkout's folders the tests read, named once (tests live at several depths below tests/)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
EXAMPLES = REPO / "examples"
FIXTURES = TESTS / "fixtures"


def package_files(package_dir: Path) -> set[str]:
    """The files a package folder holds, as installed paths (package/...): what a wheel or an image must carry,
    build leftovers (__pycache__, .pyc) aside."""
    return {p.relative_to(package_dir.parent).as_posix() for p in package_dir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
