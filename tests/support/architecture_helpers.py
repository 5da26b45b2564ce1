"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/test_architecture.py, tests/integration/test_architecture.py."""

from __future__ import annotations

from pathlib import Path

from mirrors import REPO

from istar.layers import MAY_IMPORT

PACKAGE = REPO / "istar"


def _modules() -> dict[str, Path]:
    return {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
            for path in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "istar":
        return None
    if len(parts) == 1:
        return "root"  # istar/__init__.py: the version and lazy names of the maths, below everything
    return parts[1] if parts[1] in MAY_IMPORT else "top"
