"""The held-out selection protocol (search.selection_split: heldout): the schema, the paths it
decides and the cut of the training split (the workflow run: tests/e2e/test_heldout_selection.py)."""

import subprocess
import sys

from workflow_helpers import ENV, REPO

from istar.data import read_meta


def test_holdout_cli_spec_and_errors(prepared, tmp_path):
    data = prepared("rte", 48, 24)
    out = tmp_path / "h"
    done = subprocess.run([sys.executable, "-m", "istar", "holdout-data", "--data", str(data), "--out", str(out),
                           "--fraction", "0.5", "--seed", "2"], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "24 of 48 training rows held out (24 of 48 components, seed 2), 24 left to the search, 0 dropped" in done.stdout
    assert "overlap: 0 of 48 held-out sentences that are a sentence of a training pair (0.0%)" in done.stdout
    assert read_meta(out)["heldout"]["seed"] == 2
    bad = subprocess.run([sys.executable, "-m", "istar", "holdout-data", "--data", str(data), "--out", str(out),
                          "--fraction", "0.9"], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "fraction must lie in (0, 0.5]" in bad.stderr
