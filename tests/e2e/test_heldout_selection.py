"""A real workflow run under search.selection_split: heldout: the search never trains on, nor
takes Σ_S from, the training rows that score it; the final runs train on the full training
split; the selection, Table 1, the report and its landing page name the protocol."""

import json

import numpy as np
import pandas as pd
from workflow_helpers import check_landing, load_test_config, save_tiny_model, snakemake, write_project

from istar.data import read_split


def test_heldout_workflow_never_trains_the_search_on_its_scoring_rows(tmp_path):
    config = load_test_config("tiny")
    config["data"]["subset"] = True  # tests/data holds a slice of each release
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
    # the report opens on the landing page (results/summary.rst), which states the protocol that ran
    protocol = "chosen on a held-out 25% of the training split (seed 1)"
    assert protocol in (tmp_path / "results/summary.md").read_text()
    assert protocol in (tmp_path / "results/report.html").read_text()
    # the landing page: a search on held-out rows, so no selection-bias sentence; the figure studies are off
    check_landing(tmp_path / "results", search="heldout", cosreg=True, studies=set())


def test_a_fixed_istar_faces_a_base_tuned_on_heldout_rows(tmp_path):
    """final.istar with search.tune_baselines under the held-out protocol: the search trains only Base, over
    its learning rates on held-out rows; I-STAR runs at the λ | ζ fixed in advance and the training
    section's values; the final Base at the learning rate its search chose; the notes say who was tuned."""
    config = load_test_config("tiny")
    config["data"]["subset"] = True
    config["final"].update(methods=["base", "istar"], istar={"tiny": {"rte": {"lam": -1, "zeta": 0.2}}})
    config["search"].update(selection_split="heldout", heldout_fraction=0.25, tune_baselines=True,
                            batch_sizes=[16], epochs=[1], learning_rates=[1e-5, 1e-3])
    config["studies"] = {name: {"enabled": False} for name in config["studies"]}
    write_project(tmp_path, config)
    save_tiny_model(tmp_path / "tiny-bert")
    result = snakemake(tmp_path, "--cores", "2")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    searched = sorted(run.parent.name for run in (tmp_path / "results/search/heldout0.25_seed0/tiny/rte").glob("*/seed0"))
    assert searched == ["base_bs16_ep1_lr0.001", "base_bs16_ep1_lr1e-05"]
    best = json.loads((tmp_path / "results/selection/tiny/rte/best.json").read_text())
    assert (best["protocol"], best["method"], best["lam"], best["settings"]) == ("fixed", "istar", -1.0, 2)
    base = best["baselines"]["base"]
    scores = {run["learning_rate"]: run["score"] for run in best["candidates"]}
    assert base["score"] == max(scores.values()) and base["learning_rate"] == max(scores, key=scores.get)
    finals = sorted(path.parent.name for path in (tmp_path / "results/runs/tiny/rte").glob("*/seed0"))
    assert finals == sorted([f"base_bs16_ep1_lr{base['learning_rate']:g}", "istar_lam-1_zeta0.2"])
    istar = json.loads((tmp_path / "results/runs/tiny/rte/istar_lam-1_zeta0.2/seed0/run_config.json").read_text())
    assert (istar["learning_rate"], istar["epochs"]) == (1e-4, 2)  # the training section's values
    table = (tmp_path / "results/tables/table1.md").read_text()
    assert "best of its 2 searched training settings, scored on a held-out 25% of the training split" in table
    assert "no tuning advantage" not in table
    assert "best of its 2 searched" in (tmp_path / "results/summary.md").read_text()
