"""inference.collapsed_runs: rerun in a real workflow run: the tiny model on 32 RTE rows answers one class
(every run collapses), so the final cell's seed is replaced once in every arm, the replacement is excluded
too, and the tables say so; a second run plans nothing."""

import json

import pandas as pd
from workflow_helpers import load_test_config, planned_jobs, save_tiny_model, snakemake, write_project


def test_a_collapsed_seed_is_replaced_once_in_every_arm(tmp_path):
    config = load_test_config("tiny")
    config["data"]["subset"] = True
    config["final"].update(methods=["base", "istar"], seeds=[0], istar={"tiny": {"rte": {"lam": -1, "zeta": 0.2}}})
    config["studies"] = {name: {"enabled": False} for name in config["studies"]}
    config["inference"] = {"collapsed_runs": "rerun"}
    write_project(tmp_path, config)
    save_tiny_model(tmp_path / "tiny-bert")
    dry = snakemake(tmp_path, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    # before the check only the config's seed is planned, and no measurement of the final stage
    assert planned_jobs(dry.stdout)["collapse_check"] == 1 and "measure" not in planned_jobs(dry.stdout)
    result = snakemake(tmp_path, "--cores", "2")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    check = json.loads((tmp_path / "results/collapse/tiny/rte.json").read_text())
    assert (check["collapsed"], check["replacements"]) == ([0], {"0": 1})
    runs = pd.read_csv(tmp_path / "results/aggregate/runs.csv")
    final = runs[runs["study"] == "final"]
    assert sorted(zip(final["method"], final["seed"])) == [("base", 0), ("base", 1), ("istar", 0), ("istar", 1)]
    assert final["collapsed"].astype(str).eq("True").all()  # the replacement collapsed too: excluded, not replaced again
    assert (tmp_path / "results/measures/tiny/rte/base/seeds0_1.json").is_file()
    # no pair is left to compare: paired.csv holds no row of the cell, the tables count what was excluded
    paired = pd.read_csv(tmp_path / "results/aggregate/paired.csv")
    assert paired[paired["study"] == "final"].empty
    table = (tmp_path / "results/tables/table1.md").read_text().replace("\\_", "_")
    assert "inference.collapsed_runs: rerun" in table and "Base 2 of 2, 2 excluded" in table
    assert "| tiny | Base |" in table.replace("  ", " ")  # the emptied cell is still listed

    again = snakemake(tmp_path, "-n")
    assert again.returncode == 0 and planned_jobs(again.stdout) == {}, again.stdout[-3000:]
