"""The held-out selection protocol (search.selection_split: heldout): the schema, the paths it
decides and the cut of the training split (the workflow run: tests/workflow/test_heldout_selection.py)."""

import subprocess
import sys

import pytest
from workflow_helpers import ENV, REPO

from istar.config.layout import DATA, SEARCH_RUN, SIGMA, search_templates
from istar.config.schema import ConfigError, load_schema
from istar.data import read_meta, read_split
from istar.data.holdout import holdout_split
from istar.pipeline.plan import heldout_name, holdout_spec
from istar.pipeline.validate import validate_config
from istar.report.select import PROTOCOLS


def test_the_schema_offers_exactly_the_registered_protocols():
    search = load_schema()["properties"]["search"]["properties"]
    # the two splits a search can be scored on, and the protocol with no search (final.istar)
    assert search["selection_split"]["enum"] + ["fixed"] == list(PROTOCOLS)
    assert "istar" in load_schema()["properties"]["final"]["properties"]
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
