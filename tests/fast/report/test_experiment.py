"""istar.report.experiment: Table 1's cells, the λ sweep and the Σ_S curves in DVC's form, from aggregate rows."""

import json

import pandas as pd
import pytest

from istar.report.experiment import write_experiment
from istar.report.comparisons import study_tests


def runs_frame():
    rows = []
    for seed, (base, cosreg) in enumerate([(0.60, 0.64), (0.62, 0.63), (0.58, 0.65)]):
        for method, score, iso in (("base", base, 0.2), ("cosreg", cosreg, 0.3)):
            rows.append(dict(study="final", model="m", task="rte", method=method, seed=seed, metric="accuracy",
                             score=score, isoscore_star=iso + seed / 100, lam=1.0 if method == "cosreg" else 0.0))
    for lam in (-1.0, 1.0):
        for seed in (0, 1):
            rows.append(dict(study="lambda_sweep", model="m", task="rte", method="istar", seed=seed, metric="accuracy",
                             score=0.5 + lam / 10 + seed / 100, isoscore_star=0.4 - lam / 10, lam=lam))
    return pd.DataFrame(rows)


def test_cells_curves_and_a_missing_interval(tmp_path):
    runs = runs_frame()
    aggregate = tmp_path / "aggregate"
    aggregate.mkdir()
    runs.to_csv(aggregate / "runs.csv", index=False)
    # as istar aggregate writes it: the score, IsoScore* and (where measured) cosine rows of each cell
    study_tests(runs).paired.to_csv(aggregate / "paired.csv", index=False)
    pd.DataFrame([dict(study="final", model="m", task="rte", method=method, seed=seed, epoch=epoch,
                       sigma_s_isoscore=0.1 * epoch + seed / 10)
                  for method in ("base", "cosreg") for seed in (0, 1) for epoch in (0, 1, 2)]
                 ).to_csv(aggregate / "epochs.csv", index=False)
    (tmp_path / "out" / "sigma_epochs").mkdir(parents=True)
    (tmp_path / "out" / "sigma_epochs" / "m-rte-istar.csv").write_text("epoch,sigma_s_isoscore\n0,1\n")  # stale

    metrics = write_experiment(aggregate, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
    base, cosreg = metrics["m"]["rte"]["base"], metrics["m"]["rte"]["cosreg"]
    assert base == {"mean": pytest.approx(0.60), "isoscore_star": pytest.approx(0.21), "seeds": 3}
    assert cosreg["mean"] == pytest.approx(0.64) and cosreg["pairs"] == 3
    assert cosreg["difference"] == pytest.approx(0.04) and cosreg["ci_low"] < 0.04 < cosreg["ci_high"]
    sweep = pd.read_csv(tmp_path / "out" / "lambda_sweep" / "m-rte.csv")
    assert sweep["lam"].tolist() == [-1.0, 1.0] and sweep["score"].tolist() == pytest.approx([0.405, 0.605])
    curves = sorted(p.name for p in (tmp_path / "out" / "sigma_epochs").iterdir())
    assert curves == ["m-rte-base.csv", "m-rte-cosreg.csv"]  # the stale curve is gone
    assert pd.read_csv(tmp_path / "out" / "sigma_epochs" / "m-rte-base.csv")["sigma_s_isoscore"].tolist() == \
        pytest.approx([0.05, 0.15, 0.25])

    # one seed: no interval (null, not NaN: JSON has none)
    one = runs[runs["seed"] == 0]
    one.to_csv(aggregate / "runs.csv", index=False)
    study_tests(one).paired.to_csv(aggregate / "paired.csv", index=False)
    cell = write_experiment(aggregate, tmp_path / "out")["m"]["rte"]["cosreg"]
    assert cell["ci_low"] is None and cell["ci_high"] is None and cell["pairs"] == 1
    assert "NaN" not in (tmp_path / "out" / "metrics.json").read_text()
