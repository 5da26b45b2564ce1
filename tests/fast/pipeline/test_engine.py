"""The private Snakemake names the workflow uses (istar.pipeline.engine.PRIVATE_NAMES) exist in the
installed Snakemake, whose major version is the one pyproject.toml pins, and no other Snakemake
internal is used in workflow/ or istar/."""

import ast
import dataclasses
import importlib
import inspect
import io
import re
import tokenize
import tomllib

import pytest
import snakemake
import snakemake.api  # noqa: F401  (snakemake.dag and snakemake.workflow import each other: load them in order)
from mirrors import REPO

from istar.pipeline.engine import PRIVATE_NAMES

# Snakemake's documented snakefile API: what a workflow may use without listing it
PUBLIC = {("snakemake.workflow", "Workflow.basedir"), ("snakemake.workflow", "Workflow.current_basedir"),
          ("snakemake.utils", "min_version")}
# an object in the workflow's code → the Snakemake class it is (its attributes are Snakemake's internals)
OWNERS = {"workflow": ("snakemake.workflow", "Workflow"), "dag": ("snakemake.dag", "DAG"),
          "DAG": ("snakemake.dag", "DAG")}


def _has(owner, name: str) -> bool:
    """Whether ``owner`` has ``name``, counting what each instance gets: a dataclass field without a class
    default, or an attribute its code assigns (``self.name = …``)."""
    if hasattr(owner, name):
        return True
    if not inspect.isclass(owner):
        return False
    return (dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}) or bool(
        re.search(rf"\bself\.{name}\s*=", inspect.getsource(owner)))


@pytest.mark.parametrize("module, path", PRIVATE_NAMES, ids=[f"{m}:{p}" for m, p in PRIVATE_NAMES])
def test_every_private_snakemake_name_the_workflow_uses_exists(module, path):
    found = importlib.import_module(module)
    for part in path.split("."):
        assert _has(found, part), f"{module}.{path}: Snakemake {snakemake.__version__} has no {part!r}"
        found = getattr(found, part, None)


def snakemake_names(source: str) -> set[tuple[str, str]]:
    """(module, attribute path) of every Snakemake name ``source`` (Python or a Snakemake rule file) uses:
    ``from snakemake.… import NAME`` and the attributes of the objects :data:`OWNERS` names."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)]
    names = set()
    for i, token in enumerate(tokens[:-2]):
        after = tokens[i + 1].string, tokens[i + 2]
        if token.type == tokenize.NAME and token.string in OWNERS and after[0] == "." and after[1].type == tokenize.NAME:
            module, owner = OWNERS[token.string]
            names.add((module, f"{owner}.{after[1].string}"))
    statements = re.findall(r"^\s*(from\s+snakemake[\w.]*\s+import\s+(?:\([^)]*\)|[^\n]+))", source,
                            flags=re.MULTILINE)
    for node in (ast.parse(statement.strip()).body[0] for statement in statements):
        names.update((node.module, alias.name) for alias in node.names)
    return names


def _listed(module: str, path: str) -> bool:
    return (module, path) in PUBLIC or any(m == module and (p == path or p.startswith(f"{path}."))
                                           for m, p in PRIVATE_NAMES)


def test_every_snakemake_internal_the_workflow_uses_is_listed():
    assert snakemake_names("from snakemake.io import is_flagged, temp  # x\nworkflow.basedir\n"
                           "w = workflow.local_exec; dag.jobs  # workflow.nothing\n'workflow.cores'") == {
        ("snakemake.io", "is_flagged"), ("snakemake.io", "temp"), ("snakemake.workflow", "Workflow.basedir"),
        ("snakemake.workflow", "Workflow.local_exec"), ("snakemake.dag", "DAG.jobs")}
    files = [REPO / "workflow" / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk")),
             *sorted((REPO / "istar").rglob("*.py"))]
    unlisted = sorted(f"{path.relative_to(REPO)}: {module}.{name}" for path in files
                      for module, name in snakemake_names(path.read_text(encoding="utf-8"))
                      if module.startswith("snakemake") and not _listed(module, name))
    assert not unlisted, ("Snakemake internals used but not on istar.pipeline.engine.PRIVATE_NAMES (add them there, "
                          "so an upgrade that renames one fails a test): " + "; ".join(unlisted))


def test_snakemake_is_pinned_to_the_major_version_installed():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["workflow"]
    pin = next(d for d in dependencies if re.match(r"snakemake[<>=]", d))
    major = int(snakemake.__version__.split(".")[0])
    assert f">={major}" in pin and f"<{major + 1}" in pin, pin
