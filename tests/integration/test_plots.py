"""Figures on synthetic aggregate data: files written, panels and series counted, clear errors."""

import subprocess
import sys

from plots_helpers import make_runs


def test_cli_writes_png_and_pdf(tmp_path):
    aggregate = tmp_path / "aggregate"
    aggregate.mkdir()
    make_runs().to_csv(aggregate / "runs.csv", index=False)
    out = tmp_path / "figures" / "fig7.png"
    result = subprocess.run([sys.executable, "-m", "istar", "figure", "fig7", "--aggregate-dir", str(aggregate),
                             "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000 and out.with_suffix(".pdf").stat().st_size > 1_000
    result = subprocess.run([sys.executable, "-m", "istar", "figure", "fig5", "--aggregate-dir", str(aggregate)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "layers.csv does not exist" in result.stderr
