"""The held-out selection protocol (search.selection_split: heldout): the cut of the training
split, and a real workflow run whose search never trains on, nor takes Σ_S from, the rows that
score it, while the final runs train on the full training split."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from istar.config.layout import DATA, SEARCH_RUN, SIGMA, search_templates
from istar.config.schema import ConfigError, load_schema
from istar.data import read_meta, read_split
from istar.data.holdout import holdout_split
from istar.pipeline.plan import heldout_name, holdout_spec
from istar.pipeline.validate import validate_config
from istar.report.select import PROTOCOLS
from workflow_helpers import ENV, MIRROR, REPO, load_test_config, save_tiny_model, snakemake, write_project


def test_the_schema_offers_exactly_the_registered_protocols():
    search = load_schema()["properties"]["search"]["properties"]
    assert search["selection_split"]["enum"] == list(PROTOCOLS)
    assert search["selection_split"]["default"] == "validation"  # the paper's protocol stays the default


def test_the_protocol_decides_the_search_paths():
    default = validate_config({}, check_paths=False)
    assert heldout_name(default) is None and search_templates(None) == ("", DATA, SIGMA, SEARCH_RUN)
    heldout = validate_config({"search": {"selection_split": "heldout"}}, check_paths=False)
    assert (heldout["search"]["heldout_fraction"], heldout["search"]["heldout_seed"]) == (0.2, 0)
    assert heldout_name(heldout) == "heldout0.2_seed0"
    assert search_templates("heldout0.2_seed0") == (
        "heldout0.2_seed0/", "resources/data/{task}/heldout0.2_seed0",
        "resources/shrinkage/{model}/{task}/heldout0.2_seed0/sigma0.pt",
        "results/search/heldout0.2_seed0/{model}/{task}/{setting}/seed{seed}")
    spec = holdout_spec(heldout, data_dir="resources/data/rte", out="resources/data/rte/heldout0.2_seed0")
    assert (spec.fraction, spec.seed) == (0.2, 0)
    with pytest.raises(ConfigError, match="search.heldout_fraction"):
        validate_config({"search": {"selection_split": "heldout", "heldout_fraction": 0.7}}, check_paths=False)
    with pytest.raises(ConfigError, match="search.selection_split"):
        validate_config({"search": {"selection_split": "test"}}, check_paths=False)


def test_holdout_split_is_a_seeded_disjoint_cut_of_the_training_rows(prepared, tmp_path):
    data = prepared("rte", 48, 24)
    meta = holdout_split(data, tmp_path / "a", fraction=0.25, seed=0)
    train, held = read_split(tmp_path / "a", "train"), read_split(tmp_path / "a", "validation")
    full = read_split(data, "train")
    assert len(held) == 12 and len(train) == 36
    assert set(train["idx"]).isdisjoint(held["idx"])
    assert sorted([*train["idx"], *held["idx"]]) == sorted(full["idx"])
    # the held-out rows are training rows, never the validation rows the tables report
    assert set(held["idx"]) <= set(full["idx"]) and list(train["idx"]) == sorted(train["idx"])
    assert meta["heldout"] == {"of": str(data), "of_train_sha256": read_meta(data)["split_sha256"]["train.parquet"],
                               "fraction": 0.25, "seed": 0, "unit": "row", "held_out": 12, "units": 48}
    assert read_meta(tmp_path / "a")["rows"] == {"train": 36, "validation": 12}
    same = holdout_split(data, tmp_path / "b", fraction=0.25, seed=0)
    other = holdout_split(data, tmp_path / "c", fraction=0.25, seed=1)
    assert same["heldout"] == meta["heldout"]
    assert read_split(tmp_path / "b", "validation")["idx"].tolist() == held["idx"].tolist()
    assert read_split(tmp_path / "c", "validation")["idx"].tolist() != held["idx"].tolist()
    assert other["heldout"]["seed"] == 1
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 0.5\]"):
        holdout_split(data, tmp_path / "d", fraction=0.7, seed=0)


def test_squad_is_held_out_by_article(prepared, tmp_path):
    data = prepared("squad", 60, 8)
    holdout_split(data, tmp_path / "q", fraction=0.3, seed=0)
    train, held = read_split(tmp_path / "q", "train"), read_split(tmp_path / "q", "validation")
    assert len(held) and set(train["title"]).isdisjoint(held["title"])
    assert sorted([*train["id"], *held["id"]]) == sorted(read_split(data, "train")["id"])


def test_holdout_cli_spec_and_errors(prepared, tmp_path):
    data = prepared("rte", 48, 24)
    out = tmp_path / "h"
    done = subprocess.run([sys.executable, "-m", "istar", "holdout-data", "--data", str(data), "--out", str(out),
                           "--fraction", "0.5", "--seed", "2"], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "24 of 48 training rows held out" in done.stdout and read_meta(out)["heldout"]["seed"] == 2
    bad = subprocess.run([sys.executable, "-m", "istar", "holdout-data", "--data", str(data), "--out", str(out),
                          "--fraction", "0.9"], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "fraction must be in (0, 0.5]" in bad.stderr


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"the data mirror {MIRROR} is not there")
def test_heldout_workflow_never_trains_the_search_on_its_scoring_rows(tmp_path):
    config = load_test_config("tiny")
    config["search"].update(selection_split="heldout", heldout_fraction=0.25, heldout_seed=1)
    config["studies"] = {name: {"enabled": False} for name in config["studies"]}
    write_project(tmp_path, config)
    save_tiny_model(tmp_path / "tiny-bert")
    result = snakemake(tmp_path, "--cores", "2")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    full, heldout_dir = tmp_path / "resources/data/rte", tmp_path / "resources/data/rte/heldout0.25_seed1"
    full_train, reported = read_split(full, "train"), read_split(full, "validation")
    search_train, held = read_split(heldout_dir, "train"), read_split(heldout_dir, "validation")
    assert len(held) == 8 and set(search_train["idx"]).isdisjoint(held["idx"])
    assert set(held["idx"]) | set(search_train["idx"]) == set(full_train["idx"])

    search_runs = sorted((tmp_path / "results/search/heldout0.25_seed1/tiny/rte").glob("*/seed0"))
    assert len(search_runs) == 2  # λ ∈ {−1, 1} × ζ = 0.2
    for run in search_runs:
        run_config = json.loads((run / "run_config.json").read_text())
        assert run_config["data_dir"] == "resources/data/rte/heldout0.25_seed1"
        assert run_config["sigma_s"] == "resources/shrinkage/tiny/rte/heldout0.25_seed1/sigma0.pt"
        assert run_config["data_meta"]["rows"] == {"train": 24, "validation": 8}
    sigma = json.loads((tmp_path / "resources/shrinkage/tiny/rte/heldout0.25_seed1/sigma0.json").read_text())
    assert sigma["data_dir"] == "resources/data/rte/heldout0.25_seed1" and sigma["heldout"]["seed"] == 1
    assert json.loads((tmp_path / "resources/shrinkage/tiny/rte/sigma0.json").read_text())["heldout"] is None

    best = json.loads((tmp_path / "results/selection/tiny/rte/best.json").read_text())
    assert (best["protocol"], best["heldout_fraction"], best["heldout_seed"], best["settings"]) == ("heldout", 0.25, 1, 2)
    for setting in ("base", "cosreg_lam1", f"istar_lam{best['lam']:g}_zeta0.2"):
        final = json.loads((tmp_path / f"results/runs/tiny/rte/{setting}/seed0/run_config.json").read_text())
        assert final["data_dir"] == "resources/data/rte"  # the final runs train on the full training split
        assert final["data_meta"]["rows"]["train"] == len(full_train) and "heldout" not in final["data_meta"]
    assert len(reported) == 24
    selection = pd.read_csv(tmp_path / "results/aggregate/selection.csv")
    assert selection["protocol"].tolist() == ["heldout"]
    table = (tmp_path / "results/tables/table1.md").read_text()
    assert "held-out 25% of the training split (seed 1)" in table and "I-STAR − Base" in table
    assert np.isclose(pd.read_csv(tmp_path / "results/aggregate/paired.csv")["n"], 1).all()
    report = (tmp_path / "results/report.html").read_text()
    assert "Selection protocol: held-out" in report and "search.selection_split: heldout" in report
