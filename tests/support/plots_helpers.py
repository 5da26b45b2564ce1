"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/report/test_plots.py, tests/integration/test_plots.py."""

import numpy as np
import pandas as pd

MODELS = ("bert", "albert")
SWEEP = (-5.0, -3.0, -1.0, 0.5, 1.0, 3.0, 5.0)
SEEDS = (0, 1, 2)
LAYERS = 6


ANALYSIS_ZETA = 0.6  # the measurements' ζ, unlike the training ζ (0.2): a label must say the one it plots


def _run(study, model, task, method, lam, seed, score, **extra):
    zeta = extra.pop("zeta", 0.2 if method == "istar" else np.nan)
    return dict(study=study, model=model, task=task, method=method, setting=f"{method}_lam{lam:g}", lam=lam,
                zeta=zeta, layer=extra.pop("layer", np.nan), seed=seed, metric="accuracy", score=score,
                standin=False, analysis_zeta=ANALYSIS_ZETA, **extra)


def make_runs(rng=None) -> pd.DataFrame:
    """runs.csv rows of the λ sweep (RTE, STS-B), ζ sweep (RTE) and single-layer study (CoLA)."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for m, model in enumerate(MODELS):
        for task, base_score in (("rte", 0.64 + 0.05 * m), ("stsb", 0.86)):
            seeds = rng.normal(0, 0.02, len(SEEDS))  # what a seed does to every arm alike
            for lam in (0.0, *SWEEP):  # λ = 0: Base
                for seed in SEEDS:
                    iso = float(np.clip(0.25 + 0.05 * lam + rng.normal(0, 0.01), 0.01, 0.99))
                    score = base_score + seeds[seed] - 0.006 * lam + rng.normal(0, 0.008)
                    rows.append(_run("lambda_sweep", model, task, "base" if lam == 0 else "istar", lam, seed, score,
                                     isoscore_star=iso))
        for zeta in np.round(np.linspace(0, 1, 6), 1):
            for seed in SEEDS:
                score = 0.65 + 0.03 * m - 0.1 * (zeta - 0.4) ** 2 + rng.normal(0, 0.006)
                rows.append(_run("zeta_sweep", model, "rte", "istar", -1.0, seed, score, zeta=zeta))
        for layer in [np.nan, *range(1, LAYERS + 1)]:
            for seed in SEEDS:
                score = 0.55 + 0.01 * m + rng.normal(0, 0.01) + (0.004 if np.isnan(layer) else 0.0)
                rows.append(_run("single_layer", model, "cola", "istar", -1.0, seed, score, layer=layer))
    return pd.DataFrame(rows)
