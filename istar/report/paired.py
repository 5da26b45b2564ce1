"""Paired differences between each method and the baseline over the seeds both ran.

Base and the regularised runs of one model × task share their seeds, and a seed fixes the
data order, the classifier's initialisation and dropout for every method alike. The
comparison that uses this is *paired*: for each seed s run by both sides,
d_s = score(method, s) − score(base, s), and over the n paired seeds

    d̄ = (1/n) Σ_s d_s,    s_d = sqrt(Σ_s (d_s − d̄)² / (n − 1)),
    95 % interval: d̄ ± t_{0.975, n−1} · s_d / √n

(Student's t with n − 1 degrees of freedom; the same interval as a paired t-test, e.g.
``scipy.stats.ttest_rel(method, base).confidence_interval()``). With n = 1 there is no
interval. A seed that only one side ran does not enter the difference; it is listed in
``unpaired`` so a table can say so. Scores are in the units of ``runs.csv`` (fractions,
SQuAD's F1 in percent); the tables scale them.

Every comparison also says what it could have shown (:mod:`istar.report.inference`): the
paired t-test's p-value, beside it the Wilcoxon signed-rank test's and the count of seeds on each
side of zero (declared with the t-test, so that one seed with a large difference cannot carry a
verdict unseen), the p-value after Holm's correction across a family of comparisons
(:func:`adjust_family`; the workflow's family is every confirmatory test of a study,
:func:`istar.report.comparisons.study_tests`), and the minimum detectable effect, the true
difference the test would find with 80 % power at the level Holm's procedure needs at worst
(α / m for a family of m tests) given n and the observed s_d. A difference is marked (``‡``) where
the Holm-adjusted p-value is below α. Differences that do not vary (every seed moved by the same
amount, e.g. every run of both arms predicting one class) carry no information: no p-value and no
detectable effect. :func:`pooled_gains` pools the cells of each method by a random-effects
meta-analysis, in points (the tables' units).
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd
from scipy import stats

from istar.registry.methods import BASELINE_METHOD
from istar.registry.tasks import get_task
from istar.report.aggregate_csv import require_columns
from istar.report.inference import (
    adjusted_p_values,
    minimum_detectable_effect,
    paired_t_pvalue,
    random_effects,
    signed_rank_pvalue,
)

__all__ = ["PAIRED_COLUMNS", "POOLED_COLUMNS", "SIGNIFICANT", "LEVEL", "NO_INFORMATION", "difference_cell",
           "power_cell", "paired_interval", "paired_differences", "adjust_family", "informative", "pooled_gains",
           "format_p"]

LEVEL = 0.95
"""Coverage of the intervals the tables and ``paired.csv`` report."""

SIGNIFICANT = "‡"
"""Appended to a difference whose Holm-adjusted p-value is below α (significant after correcting for
every comparison of its table)."""

NO_INFORMATION = "no information"
"""What a comparison says whose paired differences do not vary (or of fewer than two pairs): no test."""

PAIRED_COLUMNS = ("study", "measure", "model", "task", "method", "reference", "metric", "n", "mean_difference",
                  "sd_difference", "ci_low", "ci_high", "level", "excludes_zero", "p_value", "p_wilcoxon",
                  "n_positive", "n_negative", "p_holm", "p_wilcoxon_holm", "significant", "mde", "mde_alpha",
                  "family_size", "seeds", "unpaired")
"""Columns of :func:`paired_differences` (``results/aggregate/paired.csv``)."""

POOLED_COLUMNS = ("study", "measure", "method", "reference", "scope", "k", "interval", "mean", "se", "ci_low",
                  "ci_high", "p_value", "mde", "tau2", "i2", "positive_cells", "significant_gains",
                  "significant_losses", "cells_left_out")
"""Columns of :func:`pooled_gains` (``results/aggregate/pooled.csv``)."""


def paired_interval(differences, level: float = LEVEL) -> tuple[float, float, float, float]:
    """Mean, sample sd and the Student-t confidence interval of paired differences.

    Parameters
    ----------
    differences : sequence of float, shape (n,)
        d_s per paired seed, NaNs not allowed (drop them first).
    level : float in (0, 1)
        Coverage of the two-sided interval.

    Returns
    -------
    (mean, sd, low, high); sd, low and high are NaN for n < 2. When every difference is equal
    (sd = 0) the interval is the single point ``[mean, mean]``.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError(f"paired_interval needs a non-empty 1-d sequence of differences, got shape {d.shape}")
    if np.isnan(d).any():
        raise ValueError("paired_interval got NaN differences: drop the seeds without a score first")
    if not 0 < level < 1:
        raise ValueError(f"the interval's level must be in (0, 1), got {level!r}")
    n, mean = len(d), float(d.mean())
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, df=n - 1)) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def _seed_scores(group: pd.DataFrame, what: str) -> dict[int, float]:
    """Seed → score of one method's runs (a seed given twice is an error; missing scores dropped)."""
    duplicated = group["seed"][group["seed"].duplicated()]
    if len(duplicated):
        raise ValueError(f"{what} has seed {int(duplicated.iloc[0])} more than once: give each run once "
                         "(one setting per method in the final study)")
    scores = group.dropna(subset=["score"])
    return {int(seed): float(score) for seed, score in zip(scores["seed"], scores["score"])}


def paired_differences(runs: pd.DataFrame, study: str = "final", reference: str = BASELINE_METHOD,
                       level: float = LEVEL, measure: str = "score") -> pd.DataFrame:
    """Every method against ``reference`` per model × task, paired by seed.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv`` of ``istar aggregate`` (columns study, model, task, method, seed, metric,
        score at least); only rows of ``study`` are used.
    study, reference : the study whose runs are compared and the method they are compared with.
    level : coverage of the intervals.
    measure : the name the rows carry in ``measure`` (what ``score`` holds: the task's score, or a
        measurement such as ``isoscore_star`` put in the ``score`` column by the caller).

    Returns
    -------
    DataFrame with :data:`PAIRED_COLUMNS`, one row per model × task × method ≠ reference that
    has runs on both sides: ``n`` paired seeds, ``mean_difference`` d̄ (method − reference,
    in the score's units), ``sd_difference`` s_d, ``ci_low``/``ci_high`` (NaN for n < 2),
    ``excludes_zero`` (True/False; NA for n < 2), ``p_value`` (paired t-test, two-sided; NaN
    without information: n < 2 or s_d = 0), ``p_wilcoxon`` (signed-rank test, two-sided),
    ``n_positive`` / ``n_negative`` (pairs above / below zero), and the family's columns of
    :func:`adjust_family` with the rows returned as the family; ``seeds`` the paired seeds
    (space-separated), ``unpaired`` the seeds only one side ran, as ``base: 3; istar: 4`` (empty
    when none).
    """
    require_columns(runs, ("study", "model", "task", "method", "seed", "metric", "score"), "runs.csv")
    chosen = runs[runs["study"] == study]
    rows = []
    for (model, task), block in chosen.groupby(["model", "task"], sort=False):
        methods = {method: group for method, group in block.groupby("method", sort=False)}
        if reference not in methods:
            continue
        base = _seed_scores(methods[reference], f"{study} runs of {reference} for {model} on {task}")
        for method, group in methods.items():
            if method == reference:
                continue
            other = _seed_scores(group, f"{study} runs of {method} for {model} on {task}")
            paired = sorted(set(base) & set(other))
            only = [(name, sorted(set(mine) - set(theirs)))
                    for name, mine, theirs in ((reference, base, other), (method, other, base))]
            unpaired = "; ".join(f"{name}: {' '.join(map(str, seeds))}" for name, seeds in only if seeds)
            differences = np.array([other[s] - base[s] for s in paired], dtype=np.float64)
            mean, sd, low, high = paired_interval(differences, level) if paired else (math.nan,) * 4
            rows.append({"study": study, "measure": measure, "model": model, "task": task, "method": method,
                         "reference": reference, "metric": group["metric"].iloc[0], "n": len(paired),
                         "mean_difference": mean, "sd_difference": sd, "ci_low": low, "ci_high": high, "level": level,
                         "excludes_zero": pd.NA if math.isnan(low) else bool(low > 0 or high < 0),
                         "p_value": paired_t_pvalue(mean, sd, len(paired)),
                         "p_wilcoxon": signed_rank_pvalue(differences),
                         "n_positive": int((differences > 0).sum()), "n_negative": int((differences < 0).sum()),
                         "seeds": " ".join(map(str, paired)), "unpaired": unpaired})
    return adjust_family(pd.DataFrame(rows, columns=list(PAIRED_COLUMNS)), level)[0]


def adjust_family(frame: pd.DataFrame, level: float = LEVEL, extra_p_values=(), gate: int | None = None
                  ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The rows of :func:`paired_differences` (any number of calls, concatenated) as one family of tests.

    Parameters
    ----------
    frame : rows with :data:`PAIRED_COLUMNS` (the family's columns are overwritten).
    level : 1 − α of the family.
    extra_p_values : p-values of other tests in the same family (e.g. the λ sweep's trend tests),
        counted in m and in the adjustment; their adjusted values and levels are returned beside the rows.
    gate : the declared primary's index in [frame's rows, extra tests] where the multiplicity plan
        gates (:func:`istar.report.inference.adjusted_p_values`); None: one Holm family.

    Returns
    -------
    (rows, extra_adjusted, extra_levels): the extra tests' adjusted p-values and verdict levels, shape
    (len(extra_p_values),), and a copy of the rows with ``p_holm`` (adjusted over the family's m tests, every row with a p-value and the extra
    ones, by the plan: Holm over all, or the gatekeeping order), ``p_wilcoxon_holm`` (the same adjustment
    with each row's signed-rank p in place of its t-test's: the rank test at the level the verdict uses),
    ``significant`` (``p_holm`` < α; NA without a test), ``family_size`` m, ``mde_alpha`` the level the
    row's verdict needs at worst (α / m; gatekeeping: α for the primary, α / (m − 1) for the others) and
    ``mde``, the minimum detectable effect at 80 % power at that level (NaN without information).
    """
    frame = frame.copy()
    alpha = 1 - level
    p_values = np.concatenate([frame["p_value"].to_numpy(dtype=float), np.asarray(extra_p_values, dtype=float)])
    adjusted, levels = adjusted_p_values(p_values, gate, alpha)
    frame["p_holm"], frame["mde_alpha"] = adjusted[:len(frame)], levels[:len(frame)]
    ranks = np.concatenate([frame["p_wilcoxon"].where(frame["p_value"].notna()).to_numpy(dtype=float),
                            p_values[len(frame):]])
    frame["p_wilcoxon_holm"] = adjusted_p_values(ranks, gate, alpha)[0][:len(frame)]
    frame["significant"] = [pd.NA if math.isnan(p) else bool(p < alpha) for p in frame["p_holm"]]
    frame["family_size"] = int(np.count_nonzero(~np.isnan(p_values)))
    frame["mde"] = [minimum_detectable_effect(int(n), float(sd), alpha=a) if informative(row) else math.nan
                    for n, sd, a, row in zip(frame["n"], frame["sd_difference"], frame["mde_alpha"], frame.itertuples())]
    frame = frame.astype({"n": "Int64", "excludes_zero": "boolean", "significant": "boolean",
                          "n_positive": "Int64", "n_negative": "Int64", "family_size": "Int64"})
    return frame, adjusted[len(frame):], levels[len(frame):]


def informative(row) -> bool:
    """Whether a comparison (a row of :func:`paired_differences`) carries information: at least two
    pairs whose differences vary. Without it there is no test, no detectable effect and no verdict."""
    return row.n is not pd.NA and int(row.n) >= 2 and float(row.sd_difference) > 0


def pooled_gains(paired: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Each method's mean paired gain over the cells of a study, pooled by a random-effects meta-analysis.

    Parameters
    ----------
    paired : rows of :func:`paired_differences` (any measures; each measure is pooled apart).
        Scores are pooled in points (each task's ``Task.percent_scale``): cells of different metrics
        in the tables' units, as the paper averages its Table 1; other measures in their own units.
    level : coverage of the pooled interval (its test's α is 1 − level).

    Returns
    -------
    DataFrame with :data:`POOLED_COLUMNS`: per study × measure × method, one row over every model
    (``scope`` ``all``) and one per model (``scope`` the model's name) when there are several:
    ``k`` informative cells pooled (:func:`informative`; the others are named in ``cells_left_out``),
    the DerSimonian–Laird ``mean``, ``se``, interval, ``p_value``, ``mde`` (the pooled gain
    detectable with 80 % power), ``tau2`` and ``i2``; ``interval`` says which interval: ``HKSJ``
    (Hartung–Knapp–Sidik–Jonkman, for 2 ≤ k < 5, where τ² is barely estimated), ``normal``, or
    ``not pooled`` for k < 2 (no estimate: one cell is reported by its own paired test); and over
    the same cells ``positive_cells`` (mean difference > 0), ``significant_gains`` and
    ``significant_losses`` (Holm-adjusted p < α, by sign).
    """
    rows = []
    for (study, measure, method, reference), block in paired.groupby(["study", "measure", "method", "reference"],
                                                                     sort=False):
        scopes = [("all", block)]
        if block["model"].nunique() > 1:
            scopes += list(block.groupby("model", sort=False))
        for scope, cells in scopes:
            usable = cells[[informative(row) for row in cells.itertuples()]]
            left_out = cells.drop(usable.index)
            significant = usable["significant"].fillna(False).astype(bool)
            row = {"study": study, "measure": measure, "method": method, "reference": reference, "scope": scope,
                   "k": len(usable), "interval": "not pooled",
                   "positive_cells": int((usable["mean_difference"] > 0).sum()),
                   "significant_gains": int((significant & (usable["mean_difference"] > 0)).sum()),
                   "significant_losses": int((significant & (usable["mean_difference"] < 0)).sum()),
                   "cells_left_out": " ".join(f"{m}/{t}" for m, t in zip(left_out["model"], left_out["task"]))}
            if len(usable) >= 2:
                factor = (usable["task"].map(lambda task: get_task(task).percent_scale).to_numpy(dtype=float)
                          if measure == "score" else np.ones(len(usable)))
                estimates = usable["mean_difference"].to_numpy(dtype=float) * factor
                spread = usable["sd_difference"].to_numpy(dtype=float) * factor
                pooled = random_effects(estimates, spread ** 2 / usable["n"].to_numpy(dtype=float), alpha=1 - level)
                row |= {key: value for key, value in asdict(pooled).items() if key in POOLED_COLUMNS}
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(POOLED_COLUMNS))
    return frame.astype({"k": "Int64", "positive_cells": "Int64", "significant_gains": "Int64",
                         "significant_losses": "Int64"})


def difference_cell(row, scale: float = 100.0, digits: int = 1) -> str:
    """A table cell ``+1.2 [+0.3, +2.1]‡ (n=5)`` from a row of :func:`paired_differences`.

    ``scale`` multiplies the difference and its interval (100 for scores kept as fractions, 1
    for SQuAD's F1 and for IsoScore*), ``digits`` are the decimals shown; ``‡`` where the
    Holm-adjusted p-value is below α; "– (n=0)" where no seed was paired, no interval where one was
    or where every pair differs by the same amount (no information: the interval would be a point).
    """
    if row is None or row.n == 0:
        return "– (n=0)"
    text = f"{row.mean_difference * scale:+.{digits}f}"
    if row.n >= 2 and not informative(row):
        return f"{text} (n={row.n}, every pair equal)"
    if row.n >= 2:
        text += (f" [{row.ci_low * scale:+.{digits}f}, {row.ci_high * scale:+.{digits}f}]"
                 + (SIGNIFICANT if row.significant is not pd.NA and row.significant else ""))
    return f"{text} (n={row.n})"


def power_cell(row, scale: float = 100.0, digits: int = 1) -> str:
    """A table cell ``p = 0.031 (rank 0.047; 7+ 1−), Holm 0.250; MDE 1.4`` from a row of
    :func:`paired_differences`: what the comparison could show — the t-test's p, the signed-rank
    test's p with the seeds above and below zero, the Holm-adjusted p and the minimum detectable
    effect (scaled like the difference); "–" without a pair, "no information" where the pairs do
    not vary or fewer than two remain."""
    if row is None or row.n == 0:
        return "–"
    if not informative(row):
        return NO_INFORMATION + (f" ({row.n} pair)" if row.n < 2 else " (every pair equal)")
    rank = "–" if math.isnan(row.p_wilcoxon) else format_p(row.p_wilcoxon)
    return (f"p = {format_p(row.p_value)} (rank {rank}; {row.n_positive}+ {row.n_negative}−), "
            f"Holm {format_p(row.p_holm)}; MDE {row.mde * scale:.{digits}f}")


def format_p(value: float) -> str:
    """A p-value as the tables print it: three decimals, ``<0.001`` below that."""
    return "<0.001" if value < 0.001 else f"{value:.3f}"
