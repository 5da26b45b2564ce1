"""What a comparison can show: p-values, Holm's correction, power and a random-effects pooled estimate.

Pure functions of numbers (NumPy and SciPy only), used by :mod:`istar.report.paired` for every
paired difference the workflow prints and by the claims table (:mod:`istar.report.claims`).

- :func:`paired_t_pvalue`: the two-sided p-value of a paired t-test from the mean, sd and n of
  the differences, t = d̄ / (s_d / √n) with n − 1 degrees of freedom.
- :func:`holm`: Holm's step-down adjustment of a family of p-values (Holm 1979), which keeps the
  probability of any false rejection in the family at most α without assuming independence.
- :func:`minimum_detectable_effect`: the smallest true mean difference a paired t-test of n pairs
  with paired sd s_d detects with the given power at level α (two-sided), from the noncentral t
  distribution; differences smaller than this can hide in a "no significant difference".
- :func:`random_effects`: the DerSimonian–Laird random-effects meta-analysis of per-cell
  estimates and their variances (DerSimonian & Laird 1986): the pooled mean, its standard error,
  interval and p-value, the between-cell variance τ², Cochran's Q and I².
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

__all__ = ["ALPHA", "POWER", "paired_t_pvalue", "holm", "minimum_detectable_effect", "Pooled", "random_effects"]

ALPHA = 0.05
"""The level of every test the workflow reports (two-sided)."""

POWER = 0.8
"""The power at which minimum detectable effects are reported."""


def paired_t_pvalue(mean: float, sd: float, n: int) -> float:
    """Two-sided p-value of the paired t-test of H0: the true mean difference is 0.

    Parameters
    ----------
    mean, sd : mean and sample standard deviation (ddof = 1) of the n paired differences.
    n : number of pairs.

    Returns
    -------
    float in [0, 1]; NaN for n < 2. With sd = 0 the test is degenerate: 1 where the mean is 0,
    else 0 (every pair moved by the same non-zero amount).
    """
    if n < 2 or math.isnan(sd) or math.isnan(mean):
        return math.nan
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return float(2 * stats.t.sf(abs(t), df=n - 1))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given.

    The k-th smallest of m p-values is multiplied by m − k + 1, the running maximum is taken so the
    adjusted values keep the order of the raw ones, and the result is capped at 1. Reject where the
    adjusted value is below α. NaNs (comparisons without a test) are left out of the family and
    stay NaN.

    Parameters
    ----------
    p_values : sequence of float, shape (m,).

    Returns
    -------
    ndarray of float, shape (m,).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"holm needs a 1-d sequence of p-values, got shape {p.shape}")
    adjusted = np.full_like(p, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    if len(tested) == 0:
        return adjusted
    if ((p[tested] < 0) | (p[tested] > 1)).any():
        raise ValueError("holm got p-values outside [0, 1]")
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    scaled = p[order] * (m - np.arange(m))
    adjusted[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return adjusted


def _two_sided_power(effect_size: float, n: int, alpha: float) -> float:
    """Power of the two-sided one-sample t-test for a standardized effect (mean / sd)."""
    df = n - 1
    critical = stats.t.isf(alpha / 2, df)
    shift = effect_size * math.sqrt(n)
    # the far tail underflows to NaN in SciPy's noncentral t for large shifts with few degrees of freedom
    wrong_tail = float(np.nan_to_num(stats.nct.cdf(-critical, df, shift), nan=0.0))
    return float(stats.nct.sf(critical, df, shift)) + wrong_tail


def minimum_detectable_effect(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided paired t-test detects with ``power`` at ``alpha``.

    Solves power(δ / s_d) = ``power`` for δ, where the power of the test with n pairs is
    P(|T| > t_{1−α/2, n−1}) for T noncentral t with n − 1 degrees of freedom and noncentrality
    √n·δ / s_d; the observed s_d stands in for the true one.

    Parameters
    ----------
    n : number of pairs (≥ 2).
    sd : sample standard deviation of the paired differences, in the score's units.
    alpha, power : level of the test and the required power, both in (0, 1).

    Returns
    -------
    float in the units of ``sd`` (NaN for n < 2 or a NaN sd; 0 when sd = 0).
    """
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha!r} and {power!r}")
    if n < 2 or math.isnan(sd):
        return math.nan
    if sd == 0:
        return 0.0
    if _two_sided_power(1e-9, n, alpha) >= power:
        return 0.0
    upper = 1.0
    while _two_sided_power(upper, n, alpha) < power:
        upper *= 2
    effect = optimize.brentq(lambda d: _two_sided_power(d, n, alpha) - power, 1e-9, upper, xtol=1e-12)
    return float(effect * sd)


@dataclass(frozen=True)
class Pooled:
    """A random-effects pooled estimate (:func:`random_effects`); all in the estimates' units.

    mean, se : the pooled mean and its standard error.
    ci_low, ci_high : its two-sided (1 − α) normal interval.
    p_value : two-sided z-test of H0: the pooled mean is 0.
    mde : the smallest pooled mean this estimate detects with 80 % power at level α,
        (z_{1−α/2} + z_{power}) · se.
    tau2 : the between-cell variance (DerSimonian–Laird, truncated at 0).
    q, i2 : Cochran's Q and I² = max(0, (Q − (k − 1)) / Q), the share of the spread beyond chance.
    k : the number of cells pooled.
    """

    mean: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    mde: float
    tau2: float
    q: float
    i2: float
    k: int


def random_effects(estimates, variances, alpha: float = ALPHA, power: float = POWER) -> Pooled:
    """The DerSimonian–Laird random-effects meta-analysis of k per-cell estimates.

    With weights w_i = 1/v_i, the fixed-effect mean μ_F = Σ w_i y_i / Σ w_i, Cochran's
    Q = Σ w_i (y_i − μ_F)² and C = Σ w_i − Σ w_i² / Σ w_i, the between-cell variance is
    τ² = max(0, (Q − (k − 1)) / C); the pooled mean is μ = Σ w*_i y_i / Σ w*_i with
    w*_i = 1 / (v_i + τ²), and se = (Σ w*_i)^(−1/2).

    Parameters
    ----------
    estimates : sequence of float, shape (k,), e.g. each cell's mean paired difference.
    variances : sequence of float, shape (k,), their sampling variances (s_d² / n), all > 0.
    alpha, power : level of the interval and test; power of the reported detectable effect.

    Returns
    -------
    :class:`Pooled`. One cell gives its own estimate with τ² = 0 and Q = I² = NaN. (statsmodels'
    ``combine_effects(..., method_re="dl")`` keeps a negative τ² estimate instead of truncating it.)
    """
    y = np.asarray(estimates, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if y.ndim != 1 or y.shape != v.shape or len(y) == 0:
        raise ValueError(f"random_effects needs two 1-d sequences of one length ≥ 1, got shapes {y.shape} and {v.shape}")
    if np.isnan(y).any() or np.isnan(v).any() or (v <= 0).any():
        raise ValueError("random_effects needs finite estimates and variances > 0: leave out cells with fewer than two "
                         "seeds or with identical differences")
    k = len(y)
    w = 1.0 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    if k > 1:
        q = float(np.sum(w * (y - fixed) ** 2))
        c = float(np.sum(w) - np.sum(w ** 2) / np.sum(w))
        tau2 = max(0.0, (q - (k - 1)) / c)
        i2 = max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0
    else:
        q, tau2, i2 = math.nan, 0.0, math.nan
    w_star = 1.0 / (v + tau2)
    mean = float(np.sum(w_star * y) / np.sum(w_star))
    se = float(math.sqrt(1.0 / np.sum(w_star)))
    z = float(stats.norm.isf(alpha / 2))
    p_value = float(2 * stats.norm.sf(abs(mean) / se))
    mde = (z + float(stats.norm.ppf(power))) * se
    return Pooled(mean=mean, se=se, ci_low=mean - z * se, ci_high=mean + z * se, p_value=p_value, mde=mde,
                  tau2=tau2, q=q, i2=i2, k=k)
