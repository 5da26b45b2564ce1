"""Change a value, rerun, get the fresh answer: a finished tiny study edited in place (the analysis ζ; then Σ_S's
row budget and the penalty layers) and rerun gives, value for value, what a fresh project of the edited config
gives, fingerprints included; each edit reruns the jobs whose specs read it and no others; a no-op edit reruns
only bookkeeping; `istar adopt-specs` names what differs and records the rest."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from workflow_helpers import REPO, TEST_DATA, load_test_config, planned_jobs, save_tiny_model, snakemake, write_project

# What differs between two runs of the same job: the time it took, the code's checkout, hashes of files holding those.
VOLATILE = {"seconds", "train_seconds", "provenance", "sha256", "created", "train_log"}
EXPENSIVE = {"shrinkage", "shrinkage_all_positions", "train", "train_search", "measure"}


def study_config() -> dict:
    """reliability.yaml with several Σ_S batches (eval_batch_size 8), all three methods, the data and model named
    relative to the project (as a user's clone names them)."""
    config = load_test_config("reliability")
    config["data"]["mirror"] = "data"
    config["training"]["eval_batch_size"] = 8
    config["final"]["methods"] = ["base", "cosreg", "istar"]
    return config


def project(root, config: dict):
    save_tiny_model(root / "tiny-bert")
    os.symlink(TEST_DATA, root / "data")
    write_project(root, config)
    return root


def run(workdir, *args):
    result = snakemake(workdir, "--cores", "2", *args)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def values(root) -> dict:
    """Every value the study produced that a rerun must reproduce: Σ_S provenance, measurements, each run's
    metrics (its fingerprint and weights' hash among them) and the aggregate CSVs."""
    found = {}
    for path in sorted((root / "resources" / "shrinkage").rglob("*.json")) + sorted((root / "results").rglob("*.json")):
        if "metrics.json" == path.name or "measures" in path.parts or "shrinkage" in path.parts:
            found[str(path.relative_to(root))] = _strip(json.loads(path.read_text()))
    for name in ("runs", "layers", "paired"):
        found[f"{name}.csv"] = (root / "results" / "aggregate" / f"{name}.csv").read_text()
    return found


def edit(config: dict, change) -> dict:
    config = json.loads(json.dumps(config))
    change(config)
    return config


def test_an_edited_study_equals_a_fresh_one_and_reruns_only_what_the_edit_touches(tmp_path):
    config = study_config()
    ours = project(tmp_path / "ours", config)
    run(ours)
    before = values(ours)

    steps = [
        ("analysis.zeta", lambda c: c["analysis"].update(zeta=0.6), {"measure"}),
        ("shrinkage.rows and penalty.layers",
         lambda c: (c["shrinkage"].update(rows=1500), c.setdefault("penalty", {}).update(layers=[2])),
         {"shrinkage", "measure", "train", "train_search"}),
    ]
    for name, change, reruns in steps:
        config = edit(config, change)
        write_project(ours, config)
        planned = set(planned_jobs(run(ours, "-n").stdout))
        assert planned & EXPENSIVE and planned & EXPENSIVE <= reruns, (name, planned)
        run(ours)
        fresh = project(tmp_path / f"fresh-{len(name)}", config)
        run(fresh)
        edited, expected = values(ours), values(fresh)
        assert edited.keys() == expected.keys(), name
        for key in expected:
            assert edited[key] == expected[key], (name, key)
        assert edited != before, name

    # a no-op edit (a comment, keys reordered) reruns bookkeeping only
    text = yaml.safe_dump(dict(reversed(list(config.items()))), sort_keys=False)
    (ours / "config.yaml").write_text("# reordered, same values\n" + text)
    assert not set(planned_jobs(run(ours, "-n").stdout)) & (EXPENSIVE | {"aggregate"})


def test_adopt_specs_records_matching_files_and_names_the_ones_that_differ(tmp_path):
    """A results folder whose Σ_S and measurement jobs recorded no spec (as before this version): adopt-specs keeps
    every file that matches the config and names the one that does not, which reruns."""
    ours = project(tmp_path / "ours", study_config())
    run(ours)
    # Snakemake's records as the earlier version left them: the Σ_S and measurement jobs' specs not among their params
    for record in (ours / ".snakemake" / "metadata").iterdir():
        metadata = json.loads(record.read_text())
        if metadata["rule"] in ("shrinkage", "measure"):
            metadata["params"] = [param for param in metadata["params"] if not param.startswith("'{")]
            record.write_text(json.dumps(metadata))
    assert set(planned_jobs(run(ours, "-n").stdout)) >= {"shrinkage", "measure"}  # every one of them would rerun
    config = edit(study_config(), lambda c: c["analysis"].update(zeta=0.6))
    write_project(ours, config)
    command = [sys.executable, "-m", "istar", "adopt-specs", "--configfile", "config.yaml",
               "--snakefile", str(REPO / "workflow" / "Snakefile")]
    result = subprocess.run(command, cwd=ours, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 Σ_S and measurement file(s) match" in result.stdout
    assert result.stdout.count("differs, reruns with what reads it: results/measures/") == 3
    assert "zeta: 0.2 → 0.6" in result.stdout
    planned = planned_jobs(run(ours, "-n").stdout)
    assert planned.get("measure") == 3 and not set(planned) & (EXPENSIVE - {"measure"}), planned


@pytest.fixture(autouse=True)
def _in_repo_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
