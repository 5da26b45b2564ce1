"""What a lab installs agrees with what the tests run (issue 34): pyproject.toml's runtime
dependencies, the conda environments of the rules (conda-forge's PyTorch, CUDA and CPU builds) and
the versions in this environment; the SLURM profile and the executor plugin it needs; the profile's
early stop signal and the time the launcher gives a multi-GPU step to save."""

import re
import tomllib
from importlib.metadata import version

import pytest
import yaml
from mirrors import REPO
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from istar.steps.launch import SAVE_GRACE_SECONDS

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RUNTIME = [Requirement(line) for line in PYPROJECT["project"]["dependencies"]]
# The rule environments and the PyTorch build each names (the rules pick one: workflow/rules/common.smk).
RULE_ENVS = {"istar.yaml": "pytorch-gpu", "istar-cpu.yaml": "pytorch-cpu"}
# PyPI name → conda-forge name, where they differ (torch: the environment's build, above).
CONDA_NAMES = {"matplotlib": "matplotlib-base"}


def conda_specs(name: str) -> dict[str, SpecifierSet]:
    """package → version specifier of an environment file's conda dependencies."""
    specs = {}
    for entry in yaml.safe_load((REPO / "envs" / name).read_text())["dependencies"]:
        if isinstance(entry, str):
            package, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", entry).groups()
            specs[package] = SpecifierSet(spec)
    return specs


def lower_bound(specifier: SpecifierSet) -> Version | None:
    bounds = [Version(spec.version) for spec in specifier if spec.operator in (">=", "==", "~=")]
    return max(bounds) if bounds else None


@pytest.mark.parametrize("env", sorted(RULE_ENVS))
def test_every_runtime_dependency_is_in_the_rule_environment_with_the_same_lower_bound(env):
    specs = conda_specs(env)
    channels = yaml.safe_load((REPO / "envs" / env).read_text())["channels"]
    assert channels == ["conda-forge", "nodefaults"], "the pytorch/nvidia channels stopped at torch 2.5"
    for requirement in RUNTIME:
        package = RULE_ENVS[env] if requirement.name == "torch" else CONDA_NAMES.get(requirement.name, requirement.name)
        assert package in specs, f"{requirement.name} ({package}) missing from envs/{env}"
        assert lower_bound(specs[package]) == lower_bound(requirement.specifier), (env, requirement, specs[package])
    other_build = ({"pytorch-gpu", "pytorch-cpu", "pytorch", "cpuonly", "pytorch-cuda"} - {RULE_ENVS[env]}) & set(specs)
    assert not other_build, f"envs/{env} names another PyTorch build too: {other_build}"
    # istar itself: installed from the workflow's source once the environment exists
    assert (REPO / "envs" / env.replace(".yaml", ".post-deploy.sh")).is_file()


def test_every_environment_file_installs_istar_the_same_way():
    envs = sorted((REPO / "envs").glob("*.yaml"))
    scripts = {path.name: (REPO / "envs" / path.name.replace(".yaml", ".post-deploy.sh")).read_text() for path in envs}
    assert len(set(scripts.values())) == 1, "the post-deploy scripts differ"
    assert "${ISTAR_SOURCE:?" in next(iter(scripts.values()))
    assert "os.environ.update(ISTAR_SOURCE=" in (REPO / "workflow" / "Snakefile").read_text()


def test_the_declared_lower_bounds_are_what_runs_here():
    """The tests run on these versions, so no lower bound promises an untested older one."""
    for requirement in RUNTIME + [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["workflow"]]:
        installed = Version(version(requirement.name))
        assert installed in requirement.specifier, (requirement, installed)
    assert Version(version("torch").split("+")[0]).release[:2] == lower_bound(
        next(r for r in RUNTIME if r.name == "torch").specifier).release[:2]


def test_the_profile_the_plugin_and_the_launcher_agree():
    profile_text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    plugin = next(Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["workflow"]
                  if r.startswith("snakemake-executor-plugin-slurm"))
    # 2.7.1 submits a gpu=N job as one task (plugin PR #464); before it, N tasks of one GPU each
    assert lower_bound(plugin.specifier) == Version("2.7.1")
    assert f"snakemake-executor-plugin-slurm ≥ {lower_bound(plugin.specifier)}" in profile_text
    profile = yaml.safe_load(profile_text)
    for rule in ("train", "train_search"):
        lead = re.fullmatch(r"'--signal=TERM@(\d+)'", profile["set-resources"][rule]["slurm_extra"])
        assert lead and int(lead.group(1)) == SAVE_GRACE_SECONDS, (rule, profile["set-resources"][rule])
    assert profile["retries"] >= 1  # the job stopped at its limit is submitted again and resumes
