"""The package's layer contract: which subpackages of ``istar`` each subpackage may import.

This is the one statement of it. ``tests/fast/test_architecture.py`` checks every import in the
package against :data:`MAY_IMPORT` (function-level imports included: a lazy import is still a
dependency), that the contract has no cycle, that no layer imports the libraries
:data:`NEVER_IMPORTS` names, that the workflow's rule files import only :data:`WORKFLOW_IMPORTS`,
and that each subpackage's ``__init__`` docstring names the same subpackages on its
``May import:`` line.

Every module may also import the package root for ``istar.__version__`` (the root imports
nothing at import time). ``istar.cli`` (the ``istar`` command) sits on top of them all.
"""

__all__ = ["MAY_IMPORT", "NEVER_IMPORTS", "WORKFLOW_IMPORTS"]

# subpackage → the subpackages it may import, bottom up (docs/architecture.md describes each)
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "io": (),
    "core": ("io",),
    "registry": ("io", "core"),
    "config": ("io", "core", "registry"),
    "data": ("io", "core", "registry", "config"),
    "models": ("io", "core", "registry", "config", "data"),
    "integrations": ("io", "core", "registry", "config", "data", "models"),
    "steps": ("io", "core", "registry", "config", "data", "models"),
    # report draws figures and tables from result files: the readers of those files live in io
    "report": ("io", "core", "registry", "config"),
    "pipeline": ("io", "core", "registry", "config", "data", "models", "steps", "report"),
}

# report jobs start in a fraction of a second, and Snakemake imports report's registries while it
# builds the DAG: torch and the model libraries would cost each of them seconds
NEVER_IMPORTS: dict[str, tuple[str, ...]] = {"report": ("torch", "transformers", "accelerate", "datasets")}

# what workflow/Snakefile and workflow/rules/*.smk import: validation and the plan, the paths and
# schema, the figure and table registries, reading a JSON file with its hash
WORKFLOW_IMPORTS: tuple[str, ...] = ("io", "config", "report", "pipeline")
