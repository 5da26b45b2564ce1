"""A study's results as DVC experiment metrics and plots (``istar experiment``), so that
``dvc exp show`` and ``dvc exp diff`` put two configurations side by side.

``metrics.json`` — Table 1's cells of the final study, per model, task and method:
    ``mean`` the mean final score over the seeds (the task's headline metric, in its own units,
    not ×100), ``isoscore_star`` the mean IsoScore* of the measured models (Table 2's) and ``seeds``
    their number; for each method but Base, ``difference`` the mean paired
    difference from Base and ``ci_low``/``ci_high`` its 95 % Student-t interval over the ``pairs``
    seeds both ran (null where fewer than two), as in ``paired.csv``.
``lambda_sweep/{model}-{task}.csv`` — the λ sweep (Fig. 3): per λ, the mean score and
    IsoScore* over the study's seeds (none when the study is off).
``sigma_epochs/{model}-{task}-{method}.csv`` — IsoScore of Σ_S after each epoch of the final
    runs (epoch 0: the pretrained model), the mean over seeds.

The files are named by model, task and method (never by a run's λ), so the same file of two
experiments is the same curve. Only ``runs.csv``, ``paired.csv`` and ``epochs.csv`` columns that
:mod:`istar.report.aggregate` documents are read.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from istar.io import artifacts
from istar.registry.methods import BASELINE_METHOD

__all__ = ["table1_metrics", "write_experiment"]

FINAL, LAMBDA_SWEEP = "final", "lambda_sweep"


def _number(value) -> float | None:
    """A JSON number, or null for a missing one (JSON has no NaN)."""
    value = float(value)
    return None if math.isnan(value) else value


def table1_metrics(runs, paired) -> dict:
    """{model: {task: {method: cell}}} of the final study (see the module's docstring)."""
    final = runs[runs["study"] == FINAL]
    metrics: dict = {}
    for (model, task, method), group in final.groupby(["model", "task", "method"], sort=True):
        metrics.setdefault(model, {}).setdefault(task, {})[method] = {
            "mean": _number(group["score"].mean()), "isoscore_star": _number(group["isoscore_star"].mean()),
            "seeds": int(group["seed"].nunique())}
    # paired.csv tests several measures of each final cell: Table 1's difference is the score's
    scores = paired[(paired["study"] == FINAL) & (paired["reference"] == BASELINE_METHOD) & (paired["measure"] == "score")]
    for row in scores.itertuples():
        cell = metrics.get(row.model, {}).get(row.task, {}).get(row.method)
        if cell is not None:
            cell.update(difference=_number(row.mean_difference), ci_low=_number(row.ci_low),
                        ci_high=_number(row.ci_high), pairs=int(row.n))
    return metrics


def _curves(frame, study: str, keys: list[str], x: str, values: list[str]) -> dict:
    """``{key}-…`` (``keys`` joined by ``-``) → DataFrame (``x``, ``values``): ``study``'s means over seeds per ``x``:
    the λ sweep's score and IsoScore* per λ, the final runs' IsoScore of Σ_S per epoch."""
    rows = frame[frame["study"] == study]
    return {"-".join(map(str, key)): group.groupby(x, sort=True)[values].mean().reset_index()
            for key, group in rows.groupby(keys, sort=True)}


def write_experiment(aggregate_dir: str | Path, out_dir: str | Path) -> dict:
    """Write metrics.json, lambda_sweep/ and sigma_epochs/ under ``out_dir`` from the aggregate CSVs; returns the metrics."""
    import pandas as pd

    aggregate_dir, out_dir = Path(aggregate_dir), Path(out_dir)
    runs, paired, epochs = (pd.read_csv(aggregate_dir / f"{name}.csv") for name in ("runs", "paired", "epochs"))
    metrics = table1_metrics(runs, paired)
    for folder, curves in (
            ("lambda_sweep", _curves(runs, LAMBDA_SWEEP, ["model", "task"], "lam", ["score", "isoscore_star"])),
            ("sigma_epochs", _curves(epochs, FINAL, ["model", "task", "method"], "epoch", ["sigma_s_isoscore"]))):
        (out_dir / folder).mkdir(parents=True, exist_ok=True)
        for stale in (out_dir / folder).glob("*.csv"):  # curves of a model, task or method no longer run
            if stale.stem not in curves:
                stale.unlink()
        for name, frame in curves.items():
            artifacts.write_text(out_dir / folder / f"{name}.csv", frame.to_csv(index=False))
    artifacts.write_text(out_dir / "metrics.json", json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--aggregate-dir", required=True, help="folder of runs.csv, paired.csv, epochs.csv (istar aggregate)")
    parser.add_argument("--out-dir", required=True, help="folder for metrics.json, lambda_sweep/, sigma_epochs/")


def run_cli(args) -> int:
    metrics = write_experiment(args.aggregate_dir, args.out_dir)
    cells = sum(len(methods) for tasks in metrics.values() for methods in tasks.values())
    print(f"{cells} Table 1 cell(s) -> {Path(args.out_dir) / 'metrics.json'}")
    return 0
