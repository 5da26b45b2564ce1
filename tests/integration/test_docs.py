"""The repository stands on its own: its documentation is complete, generated parts are current,
every istar name and subcommand it writes exists, and nothing points outside it."""

import os
import re
import subprocess
import sys
import tomllib

import pytest
from docs_helpers import FENCE, pages_with_istar_code
from mirrors import REPO


def test_config_readme_is_generated_from_the_schema():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "config-readme"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("page", pages_with_istar_code(), ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_code_block_that_imports_istar_runs(page, tmp_path):
    """A page's Python blocks run in order as one script (a later block uses an earlier one's names), in a
    fresh folder, offline with an empty Hugging Face cache: the model is the packaged MiniLM the page loads."""
    script = "\n\n".join(FENCE.findall(page.read_text(encoding="utf-8")))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{page.name}:\n{result.stderr[-4000:]}"


def test_the_documentation_site_builds_without_a_warning(tmp_path):
    """sphinx-build -W: a warning (a broken docstring, a missing page or link target) fails the build."""
    result = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                             str(REPO / "docs"), str(tmp_path / "site")], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in ("index.html", "library.html", "api/penalties.html", "configuration.html", "citing.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "api" / "penalties.html").read_text(encoding="utf-8")
    assert "shrinkage_covariance" in api and "Refresh Σ_S every epoch" in api  # generated from the docstrings
    configuration = (tmp_path / "site" / "configuration.html").read_text(encoding="utf-8")
    assert "shrinkage.recompute_every_epoch" in configuration  # the reference generated from the schema


def test_the_software_is_licensed_citable_and_versioned():
    import yaml

    from istar import __version__

    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["version"] == __version__ and citation["license"] == "MIT"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == citation["license"] and project["license-files"] == ["LICENSE"]
    assert project["authors"] == [{"name": author["name"]} for author in citation["authors"]]
    assert [reference["title"] for reference in citation["references"]] == [
        "Stable Anisotropic Regularization", "Anisotropy is Not Inherent to Transformers",
        "IsoScore: Measuring the Uniformity of Embedding Space Utilization",
        "Representation Degeneration Problem in Training Natural Language Generation Models",
        "Estimating the intrinsic dimension of datasets by a minimal neighborhood information"]
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(__version__)}\] - {citation['date-released']}$", changelog, re.M), (
        "CHANGELOG.md has no section for this version dated as CITATION.cff's date-released")
    # The citing page: the same papers, in entry types every BibTeX style knows (plain, alpha, unsrt:
    # no @software, which only biblatex defines), the software's entry at this version.
    citing = (REPO / "docs" / "citing.md").read_text(encoding="utf-8")
    entries = re.findall(r"^@(\w+)\{", citing, re.M)
    assert len(entries) == 6 and set(entries) <= {"article", "inproceedings", "misc", "book", "techreport"}, entries
    assert f"version {__version__}" in citing
    version = subprocess.run([sys.executable, "-m", "istar", "--version"], capture_output=True, text=True, cwd=REPO)
    assert version.returncode == 0 and version.stdout.strip() == f"istar {__version__}"
