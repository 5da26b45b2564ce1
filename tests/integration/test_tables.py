"""Table 1 and Table 2 from synthetic aggregate CSVs: numbers, marks, footnotes, the three formats."""

import subprocess
import sys

import pandas as pd
from tables_helpers import make_runs, make_selection


def test_cli_writes_three_files(tmp_path):
    runs, selection = tmp_path / "runs.csv", tmp_path / "selection.csv"
    make_runs().to_csv(runs, index=False)
    make_selection().to_csv(selection, index=False)
    for which, option, path in (("table1", "--runs", runs), ("table2", "--selection", selection)):
        prefix = tmp_path / "tables" / which
        result = subprocess.run([sys.executable, "-m", "istar", "table", which, option, str(path),
                                 "--out-prefix", str(prefix)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        for suffix in (".csv", ".md", ".tex"):
            assert prefix.with_name(which + suffix).stat().st_size > 100
    assert pd.read_csv(tmp_path / "tables" / "table1.csv").shape == (14, 5)  # 2 models × (3 methods + 2 × 2 comparison rows)
    assert not list((tmp_path / "tables").glob(".*"))
    result = subprocess.run([sys.executable, "-m", "istar", "table", "table1", "--runs", str(tmp_path / "nope.csv")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "nope.csv does not exist" in result.stderr
