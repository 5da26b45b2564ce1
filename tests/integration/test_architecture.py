"""The package's layers, read from its own imports (ast) and checked against the one layer contract,
:mod:`istar.layers`: which subpackages each subpackage may import, which libraries a layer never
imports, what the workflow's rule files import. Every import counts, function-level ones included:
a lazy import is still a dependency. Each subpackage's ``__init__`` docstring states its part of
the contract and is checked against it here. No module is longer than ``MAX_MODULE_LINES``.
"""

from __future__ import annotations

from architecture_helpers import _layer, _modules

from istar.layers import NEVER_IMPORTS


def test_report_runs_without_torch():
    """Importing every report module (and what it imports in turn) loads no torch."""
    import subprocess
    import sys

    report = sorted(m for m in _modules() if _layer(m) == "report")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in report)
            + f"print(sorted(name for name in {NEVER_IMPORTS['report']!r} if name in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing istar.report loads {loaded}"
