"""The repository stands on its own: its documentation is complete, generated parts are current,
and nothing points outside it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Tests and test configs (.test/) may name the larger data mirror that sits beside a checkout.
ALLOWED = ("tests/", ".test/")


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def test_nothing_refers_to_a_path_outside_the_repository():
    outside = re.compile(r"\.\./shared|/work/|/root/|/home/[a-z]|METHOD\.md|DESIGN\.md")
    hits = []
    for name in tracked_files():
        path = REPO / name
        if name.startswith(ALLOWED) or not path.is_file() or path.suffix in (".tsv", ".png", ".pdf"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not hits, "\n".join(hits)


def test_every_cited_section_of_the_method_exists():
    sections = set(re.findall(r"^## (\d+)\.", (REPO / "docs" / "method.md").read_text(encoding="utf-8"), re.M))
    cited = set()
    for path in list((REPO / "istar").rglob("*.py")) + [REPO / "workflow" / "schemas" / "config.schema.yaml"]:
        cited |= set(re.findall(r"docs/method\.md`?\s*§(\d+)", path.read_text(encoding="utf-8")))
    assert cited and cited <= sections, f"cited {sorted(cited)}, documented {sorted(sections)}"


@pytest.mark.integration
def test_config_readme_is_generated_from_the_schema():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "config-readme"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_the_docs_the_readme_links_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(((?:docs|config|bench)/[^)#]+)\)", readme):
        assert (REPO / link).is_file(), link


# ----------------------------------------------------------------------------- the documentation site and its examples

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
IMPORTS_ISTAR = re.compile(r"^\s*(import istar\b|from istar\b)", re.M)


def pages_with_istar_code() -> list[Path]:
    return [page for page in PAGES if any(IMPORTS_ISTAR.search(block) for block in FENCE.findall(page.read_text("utf-8")))]


def test_the_pages_with_library_code_are_found():
    names = {page.relative_to(REPO).as_posix() for page in pages_with_istar_code()}
    assert {"README.md", "docs/library.md"} <= names, names


def cached_hub_model(hf_home: Path) -> None:
    """The Hugging Face cache as a first download of the hub MiniLM the pages name leaves it: its files (those of
    the packaged MiniLM, which the test hub serves under that id too) in ``hub/models--…/snapshots/COMMIT``."""
    from conftest import HUB_MODEL, MINILM

    from istar.models.loading import resolve_model_source

    source = Path(resolve_model_source(MINILM))
    repo = hf_home / "hub" / f"models--{HUB_MODEL.replace('/', '--')}"
    commit = "0" * 40
    for path in (p for p in source.rglob("*") if p.is_file()):
        target = repo / "snapshots" / commit / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


@pytest.mark.parametrize("page", pages_with_istar_code(), ids=lambda page: page.relative_to(REPO).as_posix())
@pytest.mark.integration
def test_every_code_block_that_imports_istar_runs(page, tmp_path):
    """A page's Python blocks run in order as one script (a later block uses an earlier one's names), in a
    fresh folder, offline, the model they name read from a Hugging Face cache that holds it."""
    script = "\n\n".join(FENCE.findall(page.read_text(encoding="utf-8")))
    cached_hub_model(tmp_path / "hf")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{page.name}:\n{result.stderr[-4000:]}"


@pytest.mark.integration
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


@pytest.mark.integration
def test_the_software_is_licensed_citable_and_versioned():
    import yaml

    from istar import __version__

    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["version"] == __version__ and citation["license"] == "MIT"
    assert [reference["title"] for reference in citation["references"]] == [
        "Stable Anisotropic Regularization", "Anisotropy is Not Inherent to Transformers"]
    assert f"## [{__version__}]" in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    version = subprocess.run([sys.executable, "-m", "istar", "--version"], capture_output=True, text=True, cwd=REPO)
    assert version.returncode == 0 and version.stdout.strip() == f"istar {__version__}"
