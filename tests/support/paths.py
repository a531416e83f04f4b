"""The checkout's folders the tests read, named once (tests live at several depths below tests/)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
EXAMPLES = REPO / "examples"
FIXTURES = TESTS / "fixtures"
