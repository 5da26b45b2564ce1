"""The package's layers, read from its own imports (ast) and checked against the one layer contract,
:mod:`istar.layers`: which subpackages each subpackage may import, which libraries a layer never
imports, what the workflow's rule files import. Every import counts, function-level ones included:
a lazy import is still a dependency. Each subpackage's ``__init__`` docstring states its part of
the contract and is checked against it here. No module is longer than ``MAX_MODULE_LINES``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from architecture_helpers import PACKAGE, _layer, _modules

from istar.layers import MAY_IMPORT, NEVER_IMPORTS, WORKFLOW_IMPORTS


WORKFLOW = PACKAGE.parent / "workflow"
TOP = {"cli", "__main__", "__init__", "layers"}


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


def _edges():
    modules = _modules()
    for module, path in modules.items():
        for name, line in _imports(path, module):
            if name in modules:
                yield module, name, f"{path.relative_to(PACKAGE.parent)}:{line}"


def _allowed(source: str, target: str) -> bool:
    if source == target or target == "root":
        return True  # every module may read istar.__version__
    if source == "top":
        return True  # the command (istar.cli, istar.__main__) may import every layer
    return target in MAY_IMPORT.get(source, ())


def test_every_module_belongs_to_a_layer():
    strays = [m for m in _modules() if _layer(m) == "top" and m.split(".")[-1] not in TOP]
    assert not strays, f"modules outside the layer subpackages {tuple(MAY_IMPORT)}: {strays}"
    missing = sorted(set(MAY_IMPORT) - {path.parent.name for path in PACKAGE.glob("*/__init__.py")})
    assert not missing, f"istar.layers names subpackages that do not exist: {missing}"


# a module longer than this holds more than one purpose, or one a reader cannot take in at once
MAX_MODULE_LINES = 450


def test_no_module_is_longer_than_a_reader_takes_in():
    long = {module: count for module, path in sorted(_modules().items())
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, (f"modules over {MAX_MODULE_LINES} lines: {long}; split each along a seam into modules of one "
                      "purpose in the same subpackage, each with a docstring that says it, and name them in "
                      "docs/architecture.md")


def test_every_import_is_one_the_contract_allows():
    wrong = [f"{where}: {source} imports {target} (istar.{_layer(source)} may import "
             f"{', '.join(MAY_IMPORT[_layer(source)]) or 'no other layer'})"
             for source, target, where in _edges() if not _allowed(_layer(source), _layer(target))]
    assert not wrong, "imports against the layer contract (istar/layers.py):\n" + "\n".join(sorted(wrong))


def test_nothing_imports_the_command_or_the_contract():
    wrong = [f"{where}: {source} imports {target}" for source, target, where in _edges()
             if _layer(target) == "top" and _layer(source) != "top"]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_contract_has_no_cycle_and_names_only_layers():
    for layer, below in MAY_IMPORT.items():
        assert set(below) <= set(MAY_IMPORT) - {layer}, (layer, below)
    done: list[str] = []
    remaining = dict(MAY_IMPORT)
    while remaining:  # peel off the layers whose every allowed import is already placed
        ready = [layer for layer, below in remaining.items() if set(below) <= set(done)]
        assert ready, f"the layer contract has a cycle among {sorted(remaining)}"
        done += ready
        for layer in ready:
            del remaining[layer]


@pytest.mark.parametrize("layer", sorted(NEVER_IMPORTS))
def test_layer_never_imports_heavy_libraries(layer):
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for module, path in _modules().items() if _layer(module) == layer
             for name, line in _imports(path, module) if name.split(".")[0] in NEVER_IMPORTS[layer]]
    assert not wrong, f"istar.{layer} imports libraries it must not:\n" + "\n".join(wrong)


def test_the_workflow_imports_only_what_the_contract_allows():
    files = [WORKFLOW / "Snakefile", *sorted((WORKFLOW / "rules").glob("*.smk"))]
    found = {(f"{path.relative_to(PACKAGE.parent)}:{number}", match.group(1))
             for path in files for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for match in [re.match(r"\s*(?:from|import)\s+istar\.(\w+)", line)] if match}
    assert {layer for _, layer in found} >= {"pipeline"}, "the workflow no longer imports istar.pipeline: check the parser"
    wrong = sorted(f"{where}: istar.{layer}" for where, layer in found if layer not in WORKFLOW_IMPORTS)
    assert not wrong, f"the workflow may import {', '.join(WORKFLOW_IMPORTS)} (istar/layers.py):\n" + "\n".join(wrong)


def _stated_imports(layer: str) -> set[str] | None:
    """The subpackages the ``May import:`` sentence of ``istar/LAYER/__init__.py``'s docstring names."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8"))) or ""
    match = re.search(r"^May import: (.*?)\.(?:\s|$)", doc, re.MULTILINE | re.DOTALL)
    return None if match is None else set(re.findall(r"\w+", match.group(1))) & set(MAY_IMPORT)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_each_subpackage_docstring_states_its_part_of_the_contract(layer):
    stated = _stated_imports(layer)
    assert stated is not None, f"istar/{layer}/__init__.py: its docstring has no 'May import: …' sentence"
    assert stated == set(MAY_IMPORT[layer]), (
        f"istar/{layer}/__init__.py says it may import {sorted(stated)}; istar/layers.py says "
        f"{sorted(MAY_IMPORT[layer])}: make them agree")
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8"))) or ""
    unnamed = [name for name in NEVER_IMPORTS.get(layer, ()) if not re.search(rf"Never imports[^.]*\b{name}\b", doc)]
    assert not unnamed, f"istar/{layer}/__init__.py: its 'Never imports …' sentence does not name {unnamed}"


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
