"""The repository stands on its own: its documentation is complete, generated parts are current,
and nothing points outside it."""

import re
import subprocess
import sys
from pathlib import Path

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


def test_config_readme_is_generated_from_the_schema():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "config-readme"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_the_docs_the_readme_links_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(((?:docs|config|bench)/[^)#]+)\)", readme):
        assert (REPO / link).is_file(), link
