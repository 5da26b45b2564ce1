"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/test_docs.py, tests/integration/test_docs.py."""

import re
from pathlib import Path

from mirrors import REPO


# ----------------------------------------------------------------------------- the documentation site and its examples

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
IMPORTS_ISTAR = re.compile(r"^\s*(import istar\b|from istar\b)", re.M)


def pages_with_istar_code() -> list[Path]:
    return [page for page in PAGES if any(IMPORTS_ISTAR.search(block) for block in FENCE.findall(page.read_text("utf-8")))]
