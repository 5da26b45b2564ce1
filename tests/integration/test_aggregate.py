"""Tests of the search-stage selection and of the aggregate CSVs, on real run folders."""

import json
import os
import subprocess
import sys

import pandas as pd
from aggregate_helpers import aggregated, runs, search
from mirrors import REPO

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_select_cli(search, tmp_path):
    out = tmp_path / "best.json"
    done = subprocess.run([sys.executable, "-m", "istar", "select", "--task-metric", "accuracy", "--out", str(out),
                           *map(str, search)], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["lam"] == -3.0 and "λ = -3" in done.stdout


def test_aggregate_cli(aggregated, tmp_path):
    folders = aggregated["folders"]
    out = tmp_path / "cli"
    command = [sys.executable, "-m", "istar", "aggregate", "--out-dir", str(out),
               "--selection", str(aggregated["out"].parent / "best.json"), "--measures", str(aggregated["runs"]["measures"]),
               f"final={folders[('base', 0)]}", f"single_layer={folders[('istar_lam-1_zeta0.2_layer2', 0)]}"]
    done = subprocess.run(command, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "runs.csv: 2 rows" in done.stdout
    runs = pd.read_csv(out / "runs.csv")
    assert runs["study"].tolist() == ["final", "single_layer"] and len(pd.read_csv(out / "selection.csv")) == 1
    assert len(pd.read_csv(out / "dims.csv")) == 32
    missing = subprocess.run([*command[:-2], f"final={tmp_path / 'nothing'}"], env=ENV, cwd=REPO, capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
