"""Tests of the search-stage selection and of the aggregate CSVs, on real run folders."""

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from aggregate_helpers import aggregated, fake_run, runs, search

from istar.io import artifacts
from istar.io.provenance import package_sha256
from istar.report.aggregate import (
    DIMS_COLUMNS,
    LAYERS_COLUMNS,
    PROVENANCE_COLUMNS,
    RUNS_COLUMNS,
    SELECTION_COLUMNS,
    aggregate,
    parse_run_argument,
)
from istar.report.select import select_best

EXPECTED_RUNS_COLUMNS = [
    "study", "model", "task", "method", "setting", "lam", "zeta", "layer", "tokens", "batch_size", "epochs",
    "learning_rate", "seed", "metric", "score", "accuracy", "f1", "exact_match", "matthews", "pearson", "spearman", "eval_loss",
    "trivial_score", "top_label_share", "prediction_std", "collapsed", "standin", "isoscore_star", "isoscore", "cosine_similarity",
    "last_layer_isoscore_star", "analysis_zeta", "precision", "threads", "code_sha256", "run_dir"]
EXPECTED_LAYERS_COLUMNS = ["study", "model", "task", "method", "setting", "lam", "zeta", "layer", "tokens", "seed",
                           "hidden_state", "isoscore_star", "isoscore", "twonn_cls", "cosine_similarity", "standin",
                           "analysis_zeta"]
EXPECTED_DIMS_COLUMNS = ["study", "model", "task", "method", "setting", "lam", "zeta", "layer", "tokens", "seed", "dim",
                         "mean", "std"]
EXPECTED_SELECTION_COLUMNS = ["model", "task", "metric", "lam", "zeta", "batch_size", "epochs", "learning_rate",
                              "score", "score_std", "seeds", "standin", "protocol", "heldout_fraction", "heldout_seed",
                              "settings"]
EXPECTED_PAIRED_COLUMNS = ["study", "measure", "model", "task", "method", "reference", "metric", "n", "mean_difference",
                           "sd_difference", "ci_low", "ci_high", "level", "excludes_zero", "p_value", "p_wilcoxon",
                           "n_positive", "n_negative", "p_holm", "p_wilcoxon_holm", "significant", "mde", "mde_alpha",
                           "family_size", "seeds", "unpaired", "paper_model", "paper_gain", "paper_low", "paper_high",
                           "paper_p", "gap", "gap_low", "gap_high", "gap_mde", "consistent", "collapse_rule", "collapsed_reference",
                           "collapsed_method", "excluded_seeds"]
EXPECTED_TREND_COLUMNS = ["study", "model", "task", "covariate", "n", "groups", "slope", "se", "ci_low", "ci_high",
                          "level", "p_value", "p_holm", "significant", "mde", "mde_alpha", "family_size",
                          "group_variance", "residual_variance", "lambdas"]
EXPECTED_POOLED_COLUMNS = ["study", "measure", "method", "reference", "scope", "k", "interval", "mean", "se", "ci_low",
                           "ci_high", "p_value", "mde", "tau2", "i2", "positive_cells", "significant_gains",
                           "significant_losses", "cells_left_out"]


def analysis_of(runs, folder: Path) -> dict:
    """A measured run's analysis, as the measurement file holds it."""
    return json.loads(runs["measures"].read_text())["runs"][str(folder)]["analysis"]


# ------------------------------------------------------------------------------------- selection


def test_selection_averages_seeds_and_picks_the_best_mean(search, tmp_path):
    best = select_best(search, out=tmp_path / "best.json")
    assert json.loads((tmp_path / "best.json").read_text()) == json.loads(json.dumps(best))
    assert (best["model"], best["task"], best["metric"]) == ("tiny", "rte", "accuracy")
    assert (best["method"], best["lam"], best["zeta"], best["layers"]) == ("istar", -3.0, 0.4, "all")
    assert (best["batch_size"], best["epochs"], best["learning_rate"]) == (16, 1, 3e-5)
    assert best["score"] == pytest.approx(0.8) and best["score_std"] == pytest.approx(math.sqrt(0.005))
    assert best["seeds"] == 2 and best["standin"] is False
    assert [(c["lam"], c["seeds"]) for c in best["candidates"]] == [(-3.0, 2), (-1.0, 2), (-5.0, 1)]
    assert best["candidates"][1]["score"] == pytest.approx(0.7) and best["candidates"][2]["score_std"] is None
    assert best["candidates"][0]["runs"] == [str(search[2]), str(search[3])]


def test_selection_ties_go_to_smaller_lambda_then_zeta_then_order(runs, tmp_path):
    template = runs["folders"][("istar_lam-1_zeta0.2", 0)]
    make = lambda name, **kw: fake_run(template, tmp_path / "runs" / "tiny" / "rte" / name / "seed0", 0, 0.5, **kw)
    lam5 = make("a", lam=-5.0, zeta=0.2)
    lam1_zeta6 = make("b", lam=-1.0, zeta=0.6)
    lam1_zeta4 = make("c", lam=-1.0, zeta=0.4)
    plus1_zeta4 = make("d", lam=1.0, zeta=0.4)
    assert select_best([lam5, lam1_zeta6])["lam"] == -1.0
    best = select_best([lam5, lam1_zeta6, plus1_zeta4, lam1_zeta4])
    assert (best["lam"], best["zeta"]) == (1.0, 0.4)
    best = select_best([lam1_zeta4, lam5, plus1_zeta4, lam1_zeta6])
    assert (best["lam"], best["zeta"]) == (-1.0, 0.4)
    assert [c["zeta"] for c in best["candidates"]] == [0.4, 0.4, 0.6, 0.2]


def test_lambda_zero_in_the_grid_plans_base_once_and_lets_the_search_choose_it(runs, search, tmp_path):
    from istar.config.layout import Setting
    from istar.pipeline.plan import final_settings, search_settings, selected_setting
    from istar.pipeline.validate import validate_config

    config = validate_config({"search": {"lambdas": [-1, 0], "zetas": [0.2, 0.6]}}, check_paths=False)
    settings = search_settings(config, "tiny", "rte")
    # λ = 0 is Base: one run per training value, not one per ζ, and no I-STAR run with a zero weight
    assert settings.count(Setting("base")) == 1 and len(settings) == 3
    assert not any(s.method == "istar" and s.lam == 0 for s in settings)
    base = fake_run(runs["folders"][("base", 0)], tmp_path / "search" / "tiny" / "rte" / "base" / "seed0", 0, 0.95,
                    lam=0.0, zeta=None)
    assert select_best([*search, base])["method"] == "istar"  # without λ = 0 in the grid Base is not a candidate
    best = select_best([*search, base], lambda_zero=True)
    assert (best["method"], best["lam"]) == ("base", 0.0) and best["score"] == pytest.approx(0.95)
    chosen = selected_setting(best, config)
    assert chosen == Setting("base")
    # the final stage then trains Base once: the search chose no regularisation
    assert final_settings(config, chosen) == [Setting("base"), Setting("cosreg", lam=1.0)]


def test_selection_metric_option_and_errors(runs, search, tmp_path):
    assert select_best(search, metric="eval_loss")["metric"] == "eval_loss"
    with pytest.raises(ValueError, match="no final 'f1'"):
        select_best(search, metric="f1")
    with pytest.raises(ValueError, match="no run folders"):
        select_best([])
    other = fake_run(search[0], tmp_path / "runs" / "tiny" / "sst2" / "x" / "seed0", 0, 0.5, task="sst2")
    with pytest.raises(ValueError, match="mix model × task pairs tiny × rte, tiny × sst2"):
        select_best([*search, other])
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(search[0] / "run_config.json", unfinished)
    with pytest.raises(ValueError, match=f"{unfinished} has no metrics.json: metrics.json is written last, so the run "
                                         "did not finish"):
        select_best([*search, unfinished])
    with pytest.raises(ValueError, match="same setting and seed 0"):
        select_best([search[0], search[0]])



def test_selection_reads_the_protocol_from_the_runs_data(search, tmp_path):
    """A search run whose data is a held-out split says so in run_config.json; select reports it,
    and refuses runs scored on different splits."""
    heldout = {"of": "resources/data/rte", "of_train_sha256": None, "fraction": 0.25, "seed": 3, "unit": "row",
               "held_out": 12, "units": 48}
    moved = []
    for index, run in enumerate(search):
        copy = tmp_path / "results" / "search" / "heldout0.25_seed3" / "tiny" / "rte" / run.parent.name / run.name
        shutil.copytree(run, copy)
        config = json.loads((copy / "run_config.json").read_text())
        config["data_meta"] = {**config["data_meta"], "heldout": heldout}
        artifacts.write_json(copy / "run_config.json", config, digest=True)  # a new hash: readers check it
        moved.append(copy)
    best = select_best(moved)
    assert (best["protocol"], best["heldout_fraction"], best["heldout_seed"], best["settings"]) == ("heldout", 0.25, 3, 3)
    assert (best["lam"], best["model"]) == (-3.0, "tiny")  # the same choice as from the same scores
    assert select_best(search)["protocol"] == "validation"
    with pytest.raises(ValueError, match="scored on different splits.*search.selection_split"):
        select_best([*search[:2], *moved[2:]])


def test_a_fixed_istar_takes_the_baselines_tuned_beside_it(runs, search, tmp_path):
    """search.tune_baselines beside final.istar: the choice keeps the λ | ζ fixed in advance and records
    each baseline's best training values and the rows that scored them; the tables' note says who had
    the tuning advantage."""
    from istar.config.layout import Setting
    from istar.pipeline.plan import baseline_choices
    from istar.report.select import fixed_choice, protocol_note

    tuned = []
    for learning_rate, scores in ((2e-5, (0.6, 0.7)), (5e-5, (0.8, 0.75))):
        for seed, score in enumerate(scores):
            run = fake_run(runs["folders"][("base", 0)], tmp_path / "search" / "tiny" / "rte" /
                           f"base_bs16_ep1_lr{learning_rate:g}" / f"seed{seed}", seed, score, lam=0.0, zeta=None)
            config = json.loads((run / "run_config.json").read_text())
            config["learning_rate"] = learning_rate
            artifacts.write_json(run / "run_config.json", config, digest=True)
            tuned.append(run)
    fixed = {"model": "tiny", "task": "rte", "lam": -5.0, "zeta": 0.6, "tokens": "real", "layers": "all"}
    best = fixed_choice(**fixed, baseline_runs=tuned)
    assert (best["protocol"], best["method"], best["lam"], best["zeta"]) == ("fixed", "istar", -5.0, 0.6)
    assert best["learning_rate"] is None and best["settings"] == 2 and best["heldout_fraction"] is None
    assert best["baselines"]["base"]["score"] == pytest.approx(0.775)
    assert baseline_choices(best)["base"] == Setting("base", tokens=best["baselines"]["base"]["tokens"],
                                                     batch_size=16, epochs=1, learning_rate=5e-5)
    note = protocol_note("fixed", settings=2)
    assert "best of its 2 searched" in note and "biased upward" in note and "no tuning advantage" not in note
    assert "no tuning advantage over Base" in protocol_note("fixed", settings=0)
    assert "held-out 25% of the training split (seed 3)" in protocol_note("fixed", settings=2, fraction=0.25, seed=3)
    with pytest.raises(ValueError, match="I-STAR run.*only the baselines"):
        fixed_choice(**fixed, baseline_runs=[*tuned, search[0]])
    with pytest.raises(ValueError, match="of tiny × rte, the fixed choice of tiny × sst2"):
        fixed_choice(**{**fixed, "task": "sst2"}, baseline_runs=tuned)


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def test_exact_columns(aggregated):
    assert list(RUNS_COLUMNS) == EXPECTED_RUNS_COLUMNS and list(LAYERS_COLUMNS) == EXPECTED_LAYERS_COLUMNS
    assert list(DIMS_COLUMNS) == EXPECTED_DIMS_COLUMNS and list(SELECTION_COLUMNS) == EXPECTED_SELECTION_COLUMNS
    for name, columns in [("runs", EXPECTED_RUNS_COLUMNS), ("layers", EXPECTED_LAYERS_COLUMNS),
                          ("dims", EXPECTED_DIMS_COLUMNS), ("selection", EXPECTED_SELECTION_COLUMNS),
                          ("paired", EXPECTED_PAIRED_COLUMNS), ("trend", EXPECTED_TREND_COLUMNS),
                          ("pooled", EXPECTED_POOLED_COLUMNS)]:
        assert read_csv(aggregated["out"] / f"{name}.csv")[0] == columns
        assert list(aggregated["frames"][name].columns) == columns


def test_provenance_csv_names_the_code_of_every_run_and_measurement(aggregated):
    provenance = pd.read_csv(aggregated["out"] / "provenance.csv", keep_default_na=False)
    assert list(provenance.columns) == list(PROVENANCE_COLUMNS)
    runs = pd.read_csv(aggregated["out"] / "runs.csv")
    kinds = provenance["kind"].tolist()
    assert kinds == ["run"] * runs["run_dir"].nunique() + ["measurement", "aggregate"]
    assert set(provenance.loc[provenance["kind"] == "run", "path"]) == set(runs["run_dir"])
    for _, row in provenance.iterrows():  # these tests run from a git checkout
        recorded = json.loads((Path(row["path"]) / "run_config.json").read_text())["provenance"] \
            if row["kind"] == "run" else None
        assert len(row["git_commit"]) == 40 and row["torch"] and row["transformers"]
        if recorded is not None:
            assert row["git_commit"] == recorded["git"]["commit"]
            assert row["git_diff_sha256"] == (recorded["git"]["diff_sha256"] or "")


def test_runs_csv_rows_values_and_nan(aggregated):
    runs = pd.read_csv(aggregated["out"] / "runs.csv")
    # 4 final + 1 single_layer + 1 lambda_sweep + 5 search; the duplicate counts once
    assert len(runs) == 11
    assert runs["study"].value_counts().to_dict() == {"search": 5, "final": 4, "single_layer": 1, "lambda_sweep": 1}
    assert (runs["model"] == "tiny").all() and (runs["task"] == "rte").all() and (runs["metric"] == "accuracy").all()
    final = runs[runs["study"] == "final"]
    assert list(final["setting"]) == ["base", "cosreg_lam1", "istar_lam-1_zeta0.2", "istar_lam-1_zeta0.2"]
    assert list(final["lam"]) == [0.0, 1.0, -1.0, -1.0] and list(final["seed"]) == [0, 0, 0, 1]
    assert final["zeta"].isna().tolist() == [True, True, False, False] and final["layer"].isna().all()
    for column in ("f1", "exact_match", "matthews", "pearson", "spearman"):
        assert runs[column].isna().all()
    assert runs["eval_loss"].notna().all() and (runs["score"] == runs["accuracy"]).all()
    single = runs[runs["study"] == "single_layer"].iloc[0]
    assert single["layer"] == 2 and single["setting"] == "istar_lam-1_zeta0.2_layer2" and single["zeta"] == 0.2
    analysed = runs["isoscore_star"].notna()
    assert analysed.sum() == 4  # base, cosreg, istar seed 0 under final and under lambda_sweep
    assert runs.loc[analysed, "setting"].tolist() == ["base", "cosreg_lam1", "istar_lam-1_zeta0.2",
                                                      "istar_lam-1_zeta0.2"]
    assert runs["study"].tolist() == sorted(runs["study"])
    base = final.iloc[0]
    analysis = analysis_of(aggregated["runs"], aggregated["folders"][("base", 0)])
    metrics = json.loads((aggregated["folders"][("base", 0)] / "metrics.json").read_text())
    assert base["isoscore_star"] == pytest.approx(analysis["global"]["isoscore_star"], rel=1e-12)
    assert base["isoscore"] == pytest.approx(analysis["global"]["isoscore"], rel=1e-12)
    assert base["cosine_similarity"] == pytest.approx(analysis["layers"][-1]["cosine_similarity"], rel=1e-12)
    assert base["last_layer_isoscore_star"] == pytest.approx(analysis["layers"][-1]["isoscore_star"], rel=1e-12)
    assert base["score"] == pytest.approx(metrics["final"]["accuracy"]) and base["run_dir"].endswith("base/seed0")
    # what ran, from run_config.json: the precision that ran, torch's threads, the package's code
    recorded = json.loads((aggregated["folders"][("base", 0)] / "run_config.json").read_text())
    assert base["precision"] == recorded["precision"]["effective"] and base["threads"] == recorded["threads"] >= 1
    assert base["code_sha256"] == recorded["provenance"]["code_sha256"] == package_sha256()
    search = runs[runs["study"] == "search"]
    assert search["isoscore_star"].isna().all() and sorted(search["score"]) == [0.5, 0.6, 0.75, 0.85, 0.9]
    assert list(search["lam"]) == [-5.0, -3.0, -3.0, -1.0, -1.0]  # sorted by λ, then ζ, layer, seed


def test_layers_dims_and_selection_csv(aggregated):
    layers = pd.read_csv(aggregated["out"] / "layers.csv")
    assert len(layers) == 4 * 3 and list(layers["hidden_state"][:3]) == [0, 1, 2]
    assert layers["twonn_cls"].isna().tolist() == [True, False, False] * 4  # constant [CLS] embedding
    analysis = analysis_of(aggregated["runs"], aggregated["folders"][("cosreg_lam1", 0)])
    cosreg = layers[(layers["study"] == "final") & (layers["method"] == "cosreg")]
    assert cosreg["isoscore_star"].tolist() == pytest.approx([entry["isoscore_star"] for entry in analysis["layers"]])
    assert cosreg["zeta"].isna().all() and (cosreg["lam"] == 1.0).all()
    dims = pd.read_csv(aggregated["out"] / "dims.csv")
    assert len(dims) == 4 * 32 and list(dims["dim"][:32]) == list(range(32))
    cosreg_dims = dims[(dims["study"] == "final") & (dims["method"] == "cosreg")]
    assert cosreg_dims["mean"].tolist() == pytest.approx(analysis["last_layer"]["mean"])
    assert cosreg_dims["std"].tolist() == pytest.approx(analysis["last_layer"]["std"])
    selection = pd.read_csv(aggregated["out"] / "selection.csv")
    assert len(selection) == 1
    row = selection.iloc[0]
    assert (row["model"], row["task"], row["lam"], row["zeta"], row["seeds"]) == ("tiny", "rte", -3.0, 0.4, 2)
    assert row["score"] == pytest.approx(0.8) and row["score_std"] == pytest.approx(math.sqrt(0.005))
    # the search trained and was scored on the task's own splits: the paper's protocol
    assert row["protocol"] == "validation" and pd.isna(row["heldout_fraction"]) and row["settings"] == 3


def test_paired_csv_equals_scipy_on_the_final_runs(aggregated):
    from scipy import stats

    runs = pd.read_csv(aggregated["out"] / "runs.csv")
    paired = pd.read_csv(aggregated["out"] / "paired.csv").query("measure == 'score'").set_index("method")
    final = runs[runs["study"] == "final"].set_index(["method", "seed"])["score"]
    assert sorted(paired.index) == ["cosreg", "istar"] and set(paired["reference"]) == {"base"}
    assert paired.at["istar", "unpaired"] == "istar: 1" and paired.at["istar", "n"] == 1  # base ran seed 0 only
    for method, row in paired.iterrows():
        seeds = sorted(set(final[method].index) & set(final["base"].index))
        a, b = final[method].loc[seeds].to_numpy(), final["base"].loc[seeds].to_numpy()
        assert row["n"] == len(seeds) and row["mean_difference"] == pytest.approx(np.mean(a - b))
        if len(seeds) > 1:
            interval = stats.ttest_rel(a, b).confidence_interval(0.95)
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((interval.low, interval.high))


def test_epochs_csv_has_the_final_runs_sigma_isoscore_per_epoch(aggregated):
    epochs = pd.read_csv(aggregated["out"] / "epochs.csv")
    assert list(epochs.columns) == [*EXPECTED_DIMS_COLUMNS[:10], "epoch", "sigma_s_isoscore", "score"]
    assert set(epochs["study"]) == {"final"}  # neither search nor figure-study runs
    # four final runs (base, CosReg, I-STAR × 2 seeds), each before training and after its one epoch
    assert len(epochs) == 4 * 2 and list(epochs["epoch"][:2]) == [0, 1]
    for (setting, seed), folder in aggregated["folders"].items():
        if setting.endswith("layer2"):
            continue
        metrics = json.loads((folder / "metrics.json").read_text())
        rows = epochs[(epochs["setting"] == setting) & (epochs["seed"] == seed)].sort_values("epoch")
        assert rows["sigma_s_isoscore"].tolist() == pytest.approx(metrics["sigma_s_isoscore"])
        assert math.isnan(rows["score"].iloc[0]) and rows["score"].iloc[1] == pytest.approx(metrics["final"]["accuracy"])
    from istar.report.figures import draw

    fig = draw("sigma_epochs", epochs)  # one line per (method, λ): base, CosReg λ = 1, I-STAR λ = −1
    assert len(fig.axes) == 1 and len(fig.axes[0].containers) == 3


def test_empty_inputs_and_errors(runs, tmp_path):
    frames = aggregate([], [], tmp_path / "empty")
    for name, columns in [("runs", EXPECTED_RUNS_COLUMNS), ("layers", EXPECTED_LAYERS_COLUMNS),
                          ("dims", EXPECTED_DIMS_COLUMNS), ("selection", EXPECTED_SELECTION_COLUMNS),
                          ("paired", EXPECTED_PAIRED_COLUMNS), ("trend", EXPECTED_TREND_COLUMNS),
                          ("pooled", EXPECTED_POOLED_COLUMNS)]:
        assert read_csv(tmp_path / "empty" / f"{name}.csv") == [columns] and frames[name].empty
    unfinished = tmp_path / "runs" / "tiny" / "rte" / "base" / "seed9"
    unfinished.mkdir(parents=True)
    with pytest.raises(ValueError, match=f"study final: run folder {unfinished} has no metrics.json"):
        aggregate([("final", runs["folders"][("base", 0)]), ("final", unfinished)], [], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="STUDY=RUN_DIR"):
        parse_run_argument("results/runs/tiny/rte/base/seed0")
    assert parse_run_argument("final=a/b=c") == ("final", Path("a/b=c"))


def test_model_name_falls_back_to_run_config(runs, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(runs["folders"][("base", 0)], outside, ignore=shutil.ignore_patterns("model"))
    frames = aggregate([("final", outside)], [], tmp_path / "csv", [runs["measures"]])
    config = json.loads((outside / "run_config.json").read_text())
    assert frames["runs"]["model"].tolist() == [config["model"]] and frames["runs"]["setting"].tolist() == ["elsewhere"]
    assert frames["layers"].empty  # a copy is not the measured folder
