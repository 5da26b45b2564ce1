"""What a comparison can show: p-values, Holm's correction, power and a random-effects pooled estimate.

Pure functions of numbers (NumPy and SciPy only), used by :mod:`istar.report.paired` for every
paired difference the workflow prints and by the claims table (:mod:`istar.report.claims`).

- :func:`paired_t_pvalue`: the two-sided p-value of a paired t-test from the mean, sd and n of
  the differences, t = d̄ / (s_d / √n) with n − 1 degrees of freedom.
- :func:`holm`: Holm's step-down adjustment (Holm 1979), any false rejection in the family at most α
  without assuming independence; :func:`adjusted_p_values`: the declared plan, Holm or gatekeeping.
- :func:`minimum_detectable_effect`: the smallest true mean difference a paired t-test of n pairs
  with paired sd s_d detects with the given power at level α (two-sided), from the noncentral t
  distribution; differences smaller than this can hide in a "no significant difference".
- :func:`random_effects`: the DerSimonian–Laird random-effects meta-analysis of per-cell
  estimates and their variances (DerSimonian & Laird 1986): the pooled mean, its standard error,
  interval and p-value, the between-cell variance τ², Cochran's Q and I². With fewer than
  :data:`HKSJ_BELOW` cells τ² is barely estimated and the normal interval is too narrow, so the
  interval, test and detectable effect are the Hartung–Knapp–Sidik–Jonkman ones (Hartung & Knapp
  2001; Sidik & Jonkman 2002): a variance scaled by the weighted spread of the cells and Student's t
  with k − 1 degrees of freedom.
- :func:`signed_rank_pvalue`: the two-sided Wilcoxon signed-rank test of paired differences on the
  score's own grid (ties kept), the rank test reported beside every paired t-test (one seed with a
  large difference cannot carry it).
- :func:`random_intercept_slope`: the slope of a linear mixed model y = β₀ + β₁x + u_seed + ε with a
  random intercept per group, fitted by restricted maximum likelihood (the trend test of the λ sweep).
- :func:`treatment_slopes`: that slope where x is an outcome of a set treatment (IsoScore* of λ),
  split into its between- and within-treatment parts, and its two-stage least-squares fit with the
  treatment as the instrument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from istar.report.family import ALPHA, verdict_levels
from istar.report.paper import Estimate

__all__ = ["ALPHA", "POWER", "HKSJ_BELOW", "TIE_TOLERANCE", "paired_t_pvalue", "signed_rank_pvalue", "holm",
           "adjusted_p_values", "minimum_detectable_effect", "Pooled", "random_effects", "Slope", "random_intercept_slope",
           "treatment_slopes"]

POWER = 0.8
"""The power at which minimum detectable effects are reported."""

HKSJ_BELOW = 5
"""Pooled estimates over fewer cells than this use the Hartung–Knapp–Sidik–Jonkman interval."""

TIE_TOLERANCE = 1e-9
"""Paired differences this close are one value to the signed-rank test: far above floating-point noise
(~1e-16) and far below any score's grid (accuracy on n examples moves by 1/n, n < 10⁸)."""


def paired_t_pvalue(mean: float, sd: float, n: int) -> float:
    """Two-sided p-value of the paired t-test of H0: the true mean difference is 0.

    Parameters
    ----------
    mean, sd : mean and sample standard deviation (ddof = 1) of the n paired differences.
    n : number of pairs.

    Returns
    -------
    float in [0, 1]; NaN without information: n < 2, or sd = 0 (every pair moved by the same amount, so
    there is no variation to test).
    """
    if n < 2 or not sd > 0:  # a NaN sd fails the comparison too
        return math.nan
    t = mean / (sd / math.sqrt(n))
    return float(2 * stats.t.sf(abs(t), df=n - 1))


def signed_rank_pvalue(differences) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test of H0: the differences are symmetric about 0.

    A score lives on its own grid (accuracy on n examples moves in steps of 1/n), so two seeds whose
    scores moved by the same number of examples tie; computed in floating point their differences
    can part by ~1e-16, and ranked raw the tie would be lost. Absolute differences within
    :data:`TIE_TOLERANCE` of each other are therefore ranked as one value, and those within it of 0
    as zeros.

    Parameters
    ----------
    differences : sequence of float, shape (n,), the paired differences (method − reference).

    Returns
    -------
    float in [0, 1]: ``scipy.stats.wilcoxon``'s on the snapped differences, zeros kept in the ranking
    (Pratt's rule) and ties shared, exact (tie-aware) or normal as SciPy chooses. NaN where fewer than
    two differences are non-zero: the test has nothing to rank.
    """
    d = np.asarray(differences, dtype=np.float64)
    size = np.abs(d)
    order = np.argsort(size, kind="stable")
    snapped = size[order]
    snapped[snapped <= TIE_TOLERANCE] = 0.0
    for i in range(1, len(snapped)):  # sorted: a value near the one before it takes that one's value
        if snapped[i] - snapped[i - 1] <= TIE_TOLERANCE:
            snapped[i] = snapped[i - 1]
    size[order] = snapped
    d = np.sign(d) * size
    if np.count_nonzero(d) < 2:
        return math.nan
    return float(stats.wilcoxon(d, zero_method="pratt", alternative="two-sided").pvalue)


def adjusted_p_values(p_values, gate: int | None = None, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """A family's adjusted p-values and the level each test's verdict needs at worst (where its detectable
    effect is stated), in the order given; m counts the tests with a p-value (NaN: no test, left NaN).

    Parameters
    ----------
    p_values : sequence of float, shape (m,).
    gate : None: one Holm family (:func:`holm`), every level α / m. The index of the declared primary: serial
        gatekeeping (:data:`istar.report.family.MULTIPLICITY_PLANS`), the primary's own p at α, each secondary's
        Holm p among the m − 1 secondaries raised to the primary's, at α / (m − 1): a secondary passes only where
        the primary does (a primary without a test lets none pass: 1).

    Returns
    -------
    (adjusted, levels): two ndarrays of float, shape (m,).
    """
    p = np.asarray(p_values, dtype=np.float64)
    m = int(np.count_nonzero(~np.isnan(p))) + int(gate is not None and math.isnan(p[gate]))  # the primary counts
    primary_level, secondary_level = verdict_levels(gate is not None, m, alpha)
    levels = np.full_like(p, secondary_level)
    if gate is None:
        return holm(p), levels
    secondaries = p.copy()
    secondaries[gate] = np.nan
    adjusted = np.maximum(holm(secondaries), 1.0 if math.isnan(p[gate]) else p[gate])  # NaN, untested, stays
    adjusted[gate], levels[gate] = p[gate], primary_level
    return adjusted, levels


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
    tested = np.flatnonzero(~np.isnan(p))  # none: every value stays NaN
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
    interval : ``normal`` (DerSimonian–Laird's z interval) or ``HKSJ`` (Hartung–Knapp–Sidik–Jonkman:
        ``se`` scaled, Student's t with k − 1 degrees of freedom).
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
    interval: str = "normal"


def random_effects(estimates, variances, alpha: float = ALPHA, power: float = POWER,
                   hksj: bool | None = None) -> Pooled:
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
    hksj : the Hartung–Knapp–Sidik–Jonkman interval (True), the normal one (False), or None: HKSJ for
        2 ≤ k < :data:`HKSJ_BELOW`. HKSJ: se² = Σ w*_i (y_i − μ)² / ((k − 1) Σ w*_i), the interval
        μ ± t_{1−α/2, k−1} · se, the t-test's p-value, and the detectable effect
        (t_{1−α/2, k−1} + t_{power, k−1}) · se.

    Returns
    -------
    :class:`Pooled`. One cell gives its own estimate with τ² = 0 and Q = I² = NaN (callers should
    report that cell's own test instead: one cell is not a pooled estimate). (statsmodels'
    ``combine_effects(..., method_re="dl")`` keeps a negative τ² estimate instead of truncating it;
    its "random effect wls" row with ``use_t=True`` is the HKSJ estimate.)
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
    if hksj is None:
        hksj = 2 <= k < HKSJ_BELOW
    if hksj and k < 2:
        raise ValueError("the Hartung–Knapp–Sidik–Jonkman interval needs at least two cells")
    if hksj:
        se = float(math.sqrt(np.sum(w_star * (y - mean) ** 2) / ((k - 1) * np.sum(w_star))))
        critical, beta = stats.t.isf(alpha / 2, k - 1), stats.t.ppf(power, k - 1)
        p_value = float(2 * stats.t.sf(abs(mean) / se, k - 1)) if se > 0 else (1.0 if mean == 0 else 0.0)
    else:
        se = float(math.sqrt(1.0 / np.sum(w_star)))
        critical, beta = stats.norm.isf(alpha / 2), stats.norm.ppf(power)
        p_value = float(2 * stats.norm.sf(abs(mean) / se))
    critical = float(critical)
    return Pooled(mean=mean, se=se, ci_low=mean - critical * se, ci_high=mean + critical * se, p_value=p_value,
                  mde=(critical + float(beta)) * se, tau2=tau2, q=q, i2=i2, k=k,
                  interval="HKSJ" if hksj else "normal")


@dataclass(frozen=True)
class Slope:
    """The fixed slope of a random-intercept linear mixed model (:func:`random_intercept_slope`).

    estimate, se : β₁ and its standard error, in units of y per unit of x.
    ci_low, ci_high : its two-sided (1 − α) Wald interval (normal, as statsmodels' MixedLM reports).
    p_value : the Wald z-test of H0: β₁ = 0 (its detectable slope is the family's, at the level the plan
        gives it: :func:`istar.report.comparisons.study_tests`).
    intercept : β₀.
    group_variance, residual_variance : the REML estimates of Var(u) and Var(ε).
    n, groups : observations and groups fitted.
    """

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    intercept: float
    group_variance: float
    residual_variance: float
    n: int
    groups: int


def _reml_profile(log_ratio: float, blocks) -> tuple[float, np.ndarray, np.ndarray, float]:
    """−2 × the REML log-likelihood, profiled over the residual variance, at γ = exp(log_ratio) = Var(u) / Var(ε).

    Returns (deviance, β, (XᵀV⁻¹X)⁻¹ · σ²-free, σ²). Each group's V_g = σ²(I + γ11ᵀ) has the inverse
    (I − γ/(1 + γ n_g) 11ᵀ) / σ², so no N × N matrix is formed.
    """
    gamma = math.exp(log_ratio)
    a, b, logdet = 0.0, 0.0, 0.0
    weighted = []
    for x, y in blocks:
        shrink = gamma / (1.0 + gamma * len(y))
        wx = x - shrink * x.sum(axis=0, keepdims=True)
        a = a + x.T @ wx
        b = b + wx.T @ y
        logdet += math.log1p(gamma * len(y))
        weighted.append((x, y, shrink))
    a_inv = np.linalg.inv(a)
    beta = a_inv @ b
    rss = 0.0
    for x, y, shrink in weighted:
        r = y - x @ beta
        rss += float(r @ r - shrink * r.sum() ** 2)
    dof = sum(len(y) for _, y in blocks) - len(beta)
    sigma2 = rss / dof
    deviance = dof * math.log(sigma2) + logdet + float(np.linalg.slogdet(a)[1]) + dof
    return deviance, beta, a_inv, sigma2


def random_intercept_slope(y, x, groups, alpha: float = ALPHA) -> Slope:
    """The slope of y on x with a random intercept per group, by restricted maximum likelihood.

    The model: y_gi = β₀ + β₁ x_gi + u_g + ε_gi with u_g ~ N(0, σ_u²) and ε_gi ~ N(0, σ²), all
    independent (e.g. the score of the run of seed g at one λ, against that run's IsoScore*: the
    seed's random intercept absorbs what a seed does to every arm alike, its data order and
    initialisation). The REML criterion is profiled over σ² and minimised over log(σ_u² / σ²) (a
    ratio at the boundary, σ_u² = 0, is found as a very small one); β̂ is then the generalised
    least-squares estimate, with covariance σ² (XᵀṼ⁻¹X)⁻¹ (the standard error lme4 and nlme report),
    and a Wald z interval and test. The estimates are statsmodels'
    ``MixedLM.from_formula("y ~ x", groups=...).fit(reml=True)``; its standard error inverts the
    whole observed Hessian, variance terms included, and differs from this one in the third digit.

    Parameters
    ----------
    y, x : sequences of float, shape (n,): response and covariate.
    groups : sequence, shape (n,): each observation's group (at least two groups, three observations).
    alpha : level of the interval and test.

    Returns
    -------
    :class:`Slope`.
    """
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    labels = np.asarray(groups)
    if y.ndim != 1 or y.shape != x.shape or labels.shape != y.shape:
        raise ValueError(f"random_intercept_slope needs y, x and groups of one length, got {y.shape}, {x.shape}, "
                         f"{labels.shape}")
    if not (np.isfinite(y).all() and np.isfinite(x).all()):
        raise ValueError("random_intercept_slope got non-finite values: drop the runs without a score or a measurement")
    names = list(dict.fromkeys(labels.tolist()))
    if len(names) < 2 or len(y) < 3 or np.ptp(x) == 0:
        raise ValueError(f"random_intercept_slope needs at least two groups, three observations and x that varies; "
                         f"got {len(names)} group(s), {len(y)} observation(s)")
    design = np.column_stack([np.ones_like(x), x])
    blocks = [(design[labels == name], y[labels == name]) for name in names]
    fit = optimize.minimize_scalar(lambda r: _reml_profile(r, blocks)[0], bounds=(-20.0, 10.0), method="bounded",
                                   options={"xatol": 1e-10})
    _, beta, a_inv, sigma2 = _reml_profile(float(fit.x), blocks)
    se = float(math.sqrt(sigma2 * a_inv[1, 1]))
    z = float(stats.norm.isf(alpha / 2))
    estimate = float(beta[1])
    return Slope(estimate=estimate, se=se, ci_low=estimate - z * se, ci_high=estimate + z * se,
                 p_value=float(2 * stats.norm.sf(abs(estimate) / se)), intercept=float(beta[0]),
                 group_variance=float(math.exp(fit.x) * sigma2), residual_variance=float(sigma2), n=len(y),
                 groups=len(names))


def treatment_slopes(y, x, treatment, groups, alpha: float = ALPHA) -> dict[str, Estimate]:
    """The slope of y on x where ``treatment`` is set and x is an outcome of it, by least squares with a
    fixed intercept per group.

    In the λ sweep y is the score, x the fine-tuned model's IsoScore* (it moves with λ and from seed to
    seed at one λ; only the first is set by the design) and the treatment λ. With x̄_λ the mean of x per λ:
    ``between``, the coefficient of x̄_λ in y ~ x̄_λ + (x − x̄_λ) + group (what λ sets); ``within``, that
    of x in y ~ x + λ (as categories) + group (seed to seed at one λ, observational); ``iv``, two-stage
    least squares with λ (as categories) the instrument (x ~ λ + group, then y ~ x̂ + group, residuals on
    x itself): the causal slope if λ acts on the score only through x, and near ``between``.

    Parameters
    ----------
    y, x, treatment, groups : sequences of shape (n,) (y and x float, the others labels or numbers).
    alpha : level of the intervals.

    Returns
    -------
    {"between", "within", "iv"} → :class:`istar.report.paper.Estimate` (y's units per unit of x;
    Student's t with n − k degrees of freedom, k the columns of the design).
    """
    y, x, lam = (np.asarray(values, dtype=np.float64) for values in (y, x, treatment))
    group = np.asarray(groups)
    intercepts = (group[:, None] == np.unique(group)[None, :]).astype(float)
    arms = (lam[:, None] == np.unique(lam)[None, 1:]).astype(float)  # one arm absorbed by the intercepts
    arm_mean = np.array([x[lam == value].mean() for value in lam])
    first_stage = np.column_stack([arms, intercepts])
    fitted = first_stage @ np.linalg.lstsq(first_stage, x, rcond=None)[0]
    fits = {"between": (np.column_stack([arm_mean, x - arm_mean, intercepts]), None),
            "within": (np.column_stack([x, arms, intercepts]), None),
            "iv": (np.column_stack([x, intercepts]), np.column_stack([fitted, intercepts]))}
    out = {}
    for name, (design, regressors) in fits.items():
        regressors = design if regressors is None else regressors
        beta = np.linalg.lstsq(regressors, y, rcond=None)[0]
        residuals = y - design @ beta
        df = len(y) - np.linalg.matrix_rank(regressors)
        if df < 1:
            raise ValueError(f"treatment_slopes needs more runs than the {name} fit has columns; got {len(y)} runs")
        covariance = float(residuals @ residuals) / df * np.linalg.pinv(regressors.T @ regressors)
        out[name] = Estimate.of(float(beta[0]), float(math.sqrt(covariance[0, 0])), df, alpha)
    return out
