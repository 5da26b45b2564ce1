"""The private Snakemake names the workflow uses (istar.pipeline.engine.PRIVATE_NAMES) exist in the
installed Snakemake, whose major version is the one pyproject.toml pins."""

import importlib
import re
import tomllib

import pytest
import snakemake
import snakemake.api  # noqa: F401  (snakemake.dag and snakemake.workflow import each other: load them in order)
from mirrors import REPO

from istar.pipeline.engine import PRIVATE_NAMES


@pytest.mark.parametrize("module, path", PRIVATE_NAMES, ids=[f"{m}:{p}" for m, p in PRIVATE_NAMES])
def test_every_private_snakemake_name_the_workflow_uses_exists(module, path):
    found = importlib.import_module(module)
    for part in path.split("."):
        assert hasattr(found, part), f"{module}.{path}: Snakemake {snakemake.__version__} has no {part!r}"
        found = getattr(found, part)


def test_snakemake_is_pinned_to_the_major_version_installed():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["workflow"]
    pin = next(d for d in dependencies if re.match(r"snakemake[<>=]", d))
    major = int(snakemake.__version__.split(".")[0])
    assert f">={major}" in pin and f"<{major + 1}" in pin, pin
