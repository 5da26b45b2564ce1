"""The paper's own cells beside this study's: like compared with like.

A reproduction's estimate for one model × task is only comparable with the paper's gain *in that
cell* (the paper's mean over its 27 cells mixes tasks where it reports large gains with tasks
where it reports none). ``data/paper_table1.csv`` holds Rudman & Eickhoff (ICLR 2024), Table 1:
per model (ALBERT, BERT, DistilBERT), task and method (Base, CosReg, I-STAR) the mean and standard
deviation over n = 5 seeds, in points.

The paper's runs are not paired (its table gives no per-seed scores), so its gain of a method over
Base is a two-sample difference with Welch's standard error and degrees of freedom:

    g = m₁ − m₀,   se² = s₁²/n₁ + s₀²/n₀,   ν = se⁴ / ((s₁²/n₁)²/(n₁ − 1) + (s₀²/n₀)²/(n₀ − 1)).

This study's paired estimate d̄ (standard error s_d/√n, n − 1 degrees of freedom) is consistent
with the paper's when the interval of their difference d̄ − g (standard error √(se_d² + se²),
Welch–Satterthwaite degrees of freedom) holds 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scipy import stats

from istar.registry.methods import BASELINE_METHOD

__all__ = ["PAPER_TABLE1", "PAPER_MODELS", "Estimate", "paper_table1", "paper_gain", "difference"]

PAPER_TABLE1 = Path(__file__).resolve().parent / "data" / "paper_table1.csv"
PAPER_MODELS = ("albert", "bert", "distilbert")
PAPER_METRIC = {"squad": "f1"}
"""The paper's column compared with a task's score where it reports two (SQuAD: F1, as runs.csv's score)."""


@dataclass(frozen=True)
class Estimate:
    """A difference in points with its standard error, degrees of freedom and (1 − α) t interval."""

    mean: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    p_value: float

    @classmethod
    def of(cls, mean: float, se: float, df: float, alpha: float = 0.05) -> Estimate:
        half = float(stats.t.isf(alpha / 2, df)) * se
        p_value = float(2 * stats.t.sf(abs(mean) / se, df)) if se > 0 else math.nan
        return cls(mean=mean, se=se, df=df, ci_low=mean - half, ci_high=mean + half, p_value=p_value)

    def detectable(self, alpha: float = 0.05, power: float = 0.8) -> float:
        """The smallest true |value| the two-sided t-test of this estimate at ``alpha`` detects with
        ``power``: (t_{1−α/2, df} + t_{power, df}) · se, in the estimate's units."""
        return float((stats.t.isf(alpha / 2, self.df) + stats.t.ppf(power, self.df)) * self.se)

    @property
    def holds_zero(self) -> bool:
        return self.ci_low <= 0 <= self.ci_high


@lru_cache(maxsize=1)
def paper_table1():
    """The paper's Table 1 as a DataFrame: model, task, method, metric, mean, sd, n (points)."""
    import pandas as pd

    return pd.read_csv(PAPER_TABLE1, comment="#")


def paper_gain(model: str, task: str, method: str, alpha: float = 0.05) -> Estimate | None:
    """The paper's gain of ``method`` over Base for one of its models on ``task`` (Welch; module
    docstring), in points; None when Table 1 has no such cell."""
    table = paper_table1()
    metric = PAPER_METRIC.get(task)
    cells = table[(table["model"] == model) & (table["task"] == task)]
    if metric is not None:
        cells = cells[cells["metric"] == metric]
    mine, base = cells[cells["method"] == method], cells[cells["method"] == BASELINE_METHOD]
    if mine.empty or base.empty:
        return None
    (m1, s1, n1), (m0, s0, n0) = (tuple(float(v) for v in frame[["mean", "sd", "n"]].iloc[0]) for frame in (mine, base))
    return _welch(m1 - m0, s1 ** 2 / n1, n1 - 1, s0 ** 2 / n0, n0 - 1, alpha)


def difference(ours: Estimate, theirs: Estimate, alpha: float = 0.05) -> Estimate:
    """ours − theirs with the Welch–Satterthwaite interval of two independent estimates."""
    return _welch(ours.mean - theirs.mean, ours.se ** 2, ours.df, theirs.se ** 2, theirs.df, alpha)


def _welch(mean: float, v1: float, df1: float, v0: float, df0: float, alpha: float) -> Estimate:
    """``mean``, the difference of two independent estimates of variances v1, v0 on df1, df0 degrees of freedom,
    with its Welch–Satterthwaite interval: se = √(v1 + v0), ν = (v1 + v0)² / (v1²/df1 + v0²/df0)."""
    return Estimate.of(mean, math.sqrt(v1 + v0), (v1 + v0) ** 2 / (v1 ** 2 / df1 + v0 ** 2 / df0), alpha)
