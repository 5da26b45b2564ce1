"""The package's layers, read from its own imports (ast): each layer imports only the layers below it.

The order is the architecture (see each subpackage's ``__init__`` and docs/architecture.md):
``io → core → registry → config → data → models → integrations → steps → report → pipeline``, with the
command line (:mod:`istar.cli`) on top. Every import counts, function-level ones included:
a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "istar"
LAYERS = ("io", "core", "registry", "config", "data", "models", "integrations", "steps", "report", "pipeline")
TOP = {"cli", "__main__", "__init__"}
# report draws figures and tables from CSVs; torch would cost every report job seconds of start-up
NEVER_IMPORTED = {"report": {"torch", "transformers", "accelerate", "datasets"}}


def _modules() -> dict[str, Path]:
    return {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
            for path in PACKAGE.rglob("*.py")}


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """Absolute names of every module ``path`` imports (relative imports resolved), with line numbers."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "istar":
        return None
    if len(parts) == 1:
        return "root"  # istar/__init__.py: the version and lazy names of the maths, below everything
    return parts[1] if parts[1] in LAYERS else "top"


def _rank(layer: str) -> int:
    return {"root": -1, "top": len(LAYERS)}.get(layer) if layer in ("root", "top") else LAYERS.index(layer)


def _edges():
    modules = _modules()
    for module, path in modules.items():
        for name, line in _imports(path, module):
            if name in modules:
                yield module, name, f"{path.relative_to(PACKAGE.parent)}:{line}"


def test_every_module_belongs_to_a_layer():
    strays = [m for m in _modules() if _layer(m) == "top" and m.split(".")[-1] not in TOP]
    assert not strays, f"modules outside the layer subpackages {LAYERS}: {strays}"


def test_no_module_imports_a_later_layer():
    wrong = [f"{where}: {source} imports {target}" for source, target, where in _edges()
             if _rank(_layer(target)) > _rank(_layer(source))]
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize("layer", sorted(NEVER_IMPORTED))
def test_layer_never_imports_heavy_libraries(layer):
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for module, path in _modules().items() if _layer(module) == layer
             for name, line in _imports(path, module) if name.split(".")[0] in NEVER_IMPORTED[layer]]
    assert not wrong, f"istar.{layer} imports libraries it must not:\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph: dict[str, set[str]] = {}
    for source, target, _ in _edges():
        if source != target and not target.startswith(source + "."):
            graph.setdefault(source, set()).add(target)
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " → ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else nxt)
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


@pytest.mark.integration
def test_report_runs_without_torch():
    """Importing every report module (and what it imports in turn) loads no torch."""
    import subprocess
    import sys

    report = sorted(m for m in _modules() if _layer(m) == "report")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in report)
            + "print(sorted(name for name in ('torch', 'transformers', 'accelerate', 'datasets') if name in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing istar.report loads {loaded}"
