"""The inference behind every comparison the workflow prints, against statsmodels and SciPy on the same numbers."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from istar.report.inference import (
    adjusted_p_values,
    holm,
    minimum_detectable_effect,
    paired_t_pvalue,
    random_effects,
    random_intercept_slope,
    signed_rank_pvalue,
)
from istar.report.family import smallest_signed_rank_p
from istar.report.paired import paired_differences, pooled_gains

RNG = np.random.default_rng(7)


def test_the_paired_p_value_is_scipys_paired_t_test():
    method, base = RNG.normal(0.80, 0.02, 12), RNG.normal(0.79, 0.02, 12)
    d = method - base
    assert paired_t_pvalue(d.mean(), d.std(ddof=1), len(d)) == pytest.approx(stats.ttest_rel(method, base).pvalue,
                                                                            rel=1e-12)
    assert math.isnan(paired_t_pvalue(0.1, math.nan, 1))
    assert math.isnan(paired_t_pvalue(0.0, 0.0, 3)) and math.isnan(paired_t_pvalue(0.01, 0.0, 3))  # no variation


@pytest.mark.parametrize("p", [[0.01, 0.04, 0.03, 0.005, 0.5], [0.2, 0.2, 0.2], list(RNG.uniform(0, 0.1, 27)), [0.04]])
def test_holm_equals_statsmodels(p):
    assert holm(p) == pytest.approx(multipletests(p, alpha=0.05, method="holm")[1], abs=1e-15)


def test_holm_leaves_comparisons_without_a_test_out_of_the_family():
    adjusted = holm([0.01, math.nan, 0.04])
    assert math.isnan(adjusted[1])
    assert adjusted[[0, 2]] == pytest.approx(multipletests([0.01, 0.04], method="holm")[1])
    with pytest.raises(ValueError, match="outside"):
        holm([0.5, 1.5])


def test_each_multiplicity_plan_gives_its_adjusted_p_values_and_levels():
    """Hand-made: primary p = 0.03 and secondaries 0.004, 0.02, 0.5, one untested."""
    p = [0.03, 0.004, 0.02, 0.5, math.nan]
    family, levels = adjusted_p_values(p)  # one Holm family of m = 4: 0.004·4, 0.02·3, 0.03·2, 0.5·1
    assert family[:4] == pytest.approx([0.06, 0.016, 0.06, 0.5]) and math.isnan(family[4])
    assert levels[:4] == pytest.approx([0.0125] * 4)
    gated, levels = adjusted_p_values(p, gate=0)  # the primary alone at α; the secondaries Holm among 3, ≥ 0.03
    assert gated[:4] == pytest.approx([0.03, 0.03, 0.04, 0.5]) and math.isnan(gated[4])
    assert levels[:4] == pytest.approx([0.05, 0.05 / 3, 0.05 / 3, 0.05 / 3])
    shut, _ = adjusted_p_values([0.2, 0.001, 0.002], gate=0)  # the primary fails: no secondary passes
    assert shut == pytest.approx([0.2, 0.2, 0.2])
    untested, levels = adjusted_p_values([math.nan, 0.001, 0.002], gate=0)  # no primary test: the gate stays shut
    assert untested[1:] == pytest.approx([1.0, 1.0]) and levels[1:] == pytest.approx([0.025, 0.025])


@pytest.mark.parametrize("n", [3, 5, 20, 60])
def test_the_minimum_detectable_effect_is_the_power_calculation_of_statsmodels(n):
    sd = 2.2
    effect = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert minimum_detectable_effect(n, sd) == pytest.approx(effect * sd, rel=1e-6)
    # and at that effect the test has exactly the power asked for
    assert TTestPower().power(minimum_detectable_effect(n, sd) / sd, n, 0.05) == pytest.approx(0.8, abs=1e-6)


def test_the_minimum_detectable_effect_of_a_degenerate_comparison():
    assert math.isnan(minimum_detectable_effect(1, 2.0)) and minimum_detectable_effect(4, 0.0) == 0.0


@pytest.mark.parametrize("k", [2, 9, 27])
def test_the_random_effects_pool_equals_statsmodels_dersimonian_laird(k):
    estimates = RNG.normal(0.3, 2.0, k)  # spread well beyond the sampling error: τ² > 0
    variances = RNG.uniform(0.05, 0.5, k)
    pooled = random_effects(estimates, variances, hksj=False)
    reference = combine_effects(estimates, variances, method_re="dl")
    assert reference.tau2 > 0
    frame = reference.summary_frame()
    assert pooled.mean == pytest.approx(frame.loc["random effect", "eff"], rel=1e-10)
    assert pooled.se == pytest.approx(frame.loc["random effect", "sd_eff"], rel=1e-10)
    assert pooled.ci_low == pytest.approx(frame.loc["random effect", "ci_low"], rel=1e-10)
    assert pooled.ci_high == pytest.approx(frame.loc["random effect", "ci_upp"], rel=1e-10)
    assert pooled.tau2 == pytest.approx(reference.tau2, rel=1e-10)
    assert pooled.q == pytest.approx(reference.q, rel=1e-10)
    assert pooled.i2 == pytest.approx(reference.i2, rel=1e-10)
    assert pooled.p_value == pytest.approx(2 * stats.norm.sf(abs(pooled.mean) / pooled.se))


@pytest.mark.parametrize("k", [1, 9])
def test_without_heterogeneity_the_pool_is_the_fixed_effect_one(k):
    # DerSimonian and Laird truncate τ² at 0 (so does R's metafor); statsmodels 0.15 keeps the negative
    # moment estimate in its random-effects row, so compare with its fixed-effect row, which τ² = 0 gives.
    estimates = RNG.normal(0.3, 0.05, k)
    variances = RNG.uniform(0.5, 1.0, k)
    pooled = random_effects(estimates, variances, hksj=False)
    reference = combine_effects(estimates, variances, method_re="dl")
    frame = reference.summary_frame()
    assert pooled.tau2 == 0.0
    assert pooled.mean == pytest.approx(frame.loc["fixed effect", "eff"], rel=1e-10)
    assert pooled.se == pytest.approx(frame.loc["fixed effect", "sd_eff"], rel=1e-10)


def test_random_effects_refuses_cells_without_a_variance():
    with pytest.raises(ValueError, match="fewer than two seeds"):
        random_effects([0.1, 0.2], [0.01, 0.0])


def _runs(cells: dict) -> pd.DataFrame:
    rows = []
    for (task, method), scores in cells.items():
        rows += [{"study": "final", "model": "m", "task": task, "method": method, "seed": seed, "metric": "accuracy",
                  "score": score} for seed, score in enumerate(scores)]
    return pd.DataFrame(rows)


def test_paired_rows_carry_p_holm_and_mde_and_pool_in_points():
    runs = _runs({("sst2", "base"): [0.80, 0.82, 0.81, 0.79], ("sst2", "istar"): [0.83, 0.84, 0.82, 0.81],
                  ("mrpc", "base"): [0.70, 0.72, 0.74, 0.71], ("mrpc", "istar"): [0.69, 0.73, 0.72, 0.70]})
    paired = paired_differences(runs)
    assert list(paired["p_holm"]) == pytest.approx(list(multipletests(paired["p_value"], method="holm")[1]))
    for row in paired.itertuples():  # stated at α / m, the level of Holm's first step (m = 2 here)
        assert row.mde_alpha == pytest.approx(0.025) and row.family_size == 2
        assert row.mde == pytest.approx(TTestPower().solve_power(None, nobs=4, alpha=0.025, power=0.8) * row.sd_difference,
                                        rel=1e-6)
        assert row.significant == (row.p_holm < 0.05)
    pooled = pooled_gains(paired).set_index("scope").loc["all"]
    assert pooled["interval"] == "HKSJ"  # two cells: τ² is barely estimated
    variances = ((paired["sd_difference"] * 100) ** 2 / paired["n"].astype(float)).to_numpy(dtype=float)
    assert pooled["mean"] == pytest.approx(random_effects(paired["mean_difference"].to_numpy(dtype=float) * 100,
                                                          variances).mean)
    assert pooled["k"] == 2 and pooled["positive_cells"] == 1


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_hksj_pool_of_few_cells_equals_statsmodels(k):
    estimates = RNG.normal(0.3, 2.0, k)
    variances = RNG.uniform(0.05, 0.5, k)
    pooled = random_effects(estimates, variances)  # below five cells: HKSJ by default
    reference = combine_effects(estimates, variances, method_re="dl", use_t=True)
    assert reference.tau2 > 0
    row = reference.summary_frame(use_t=True).loc["random effect wls"]
    assert pooled.interval == "HKSJ"
    assert pooled.mean == pytest.approx(row["eff"], rel=1e-10)
    assert pooled.se == pytest.approx(row["sd_eff"], rel=1e-10)
    assert (pooled.ci_low, pooled.ci_high) == pytest.approx((row["ci_low"], row["ci_upp"]), rel=1e-10)
    assert pooled.p_value == pytest.approx(2 * stats.t.sf(abs(pooled.mean) / pooled.se, k - 1), rel=1e-12)
    # the interval is wider than DerSimonian-Laird's normal one, which overstates the precision of few cells
    normal = random_effects(estimates, variances, hksj=False)
    assert pooled.ci_high - pooled.ci_low > normal.ci_high - normal.ci_low or pooled.se < normal.se
    with pytest.raises(ValueError, match="at least two cells"):
        random_effects(estimates[:1], variances[:1], hksj=True)


def test_the_signed_rank_test_is_scipys_and_needs_two_nonzero_differences():
    d = np.array([0.012, -0.042, 0.02, 0.005, 0.031, 0.008, -0.003, 0.017, 0.01, 0.022])
    assert signed_rank_pvalue(d) == pytest.approx(stats.wilcoxon(d).pvalue, rel=1e-12)
    assert math.isnan(signed_rank_pvalue([0.0, 0.0, 0.0])) and math.isnan(signed_rank_pvalue([0.1, 0.0]))


def test_the_signed_rank_test_ranks_differences_on_the_scores_grid_ties_and_zeros_kept():
    """The H100 MRPC cell of the GPU study's repeat (docs/data): accuracies on 408 dev examples whose
    differences tie as counts of examples (±3, 5 and 9 twice each) but not as floats."""
    runs = pd.read_csv(Path(__file__).parents[3] / "docs/data/gpu-study-repeats/h100-runs.csv")
    arms = runs[(runs.task == "mrpc") & (runs.study == "final")].pivot(index="seed", columns="method", values="score")
    d = (arms["istar"] - arms["base"]).to_numpy()
    on_grid = np.round(d * 408) / 408
    assert len(set(np.abs(d))) > len(set(np.abs(on_grid)))  # the raw floats lose ties the examples have
    assert signed_rank_pvalue(d) == pytest.approx(stats.wilcoxon(on_grid, zero_method="pratt").pvalue, rel=1e-12)
    assert signed_rank_pvalue(d) != pytest.approx(stats.wilcoxon(d).pvalue, rel=1e-3)
    # a difference of no example is a zero (kept in the ranking, Pratt's rule), not the smallest non-zero one
    counts = np.array([3, -1, 0, 4, 2, 5, 1, 6], dtype=float)
    noisy = counts / 872
    noisy[2] = 0.1 + 0.2 - 0.3  # a zero difference as floating point leaves it (5.6e-17)
    pratt = stats.wilcoxon(counts / 872, zero_method="pratt").pvalue
    assert signed_rank_pvalue(noisy) == pytest.approx(pratt, rel=1e-12)
    assert pratt != pytest.approx(stats.wilcoxon(noisy, zero_method="pratt").pvalue, rel=1e-3)


def test_the_smallest_signed_rank_p_is_the_exact_tests_floor():
    for n in (5, 8, 9):
        assert smallest_signed_rank_p(n) == pytest.approx(stats.wilcoxon(np.arange(1.0, n + 1), method="exact").pvalue)
    # a family of 8 at 0.05 tests its first step at 0.00625: 8 seeds cannot reach it, 9 can
    assert smallest_signed_rank_p(8) > 0.05 / 8 > smallest_signed_rank_p(9)


def test_paired_rows_report_the_rank_test_and_no_test_without_variation():
    runs = _runs({("sst2", "base"): [0.80, 0.82, 0.81, 0.79, 0.80], ("sst2", "istar"): [0.83, 0.84, 0.82, 0.81, 0.70],
                  ("mrpc", "base"): [0.68] * 5, ("mrpc", "istar"): [0.68] * 5})
    paired = paired_differences(runs).set_index("task")
    sst2, mrpc = paired.loc["sst2"], paired.loc["mrpc"]
    d = np.array([0.83, 0.84, 0.82, 0.81, 0.70]) - np.array([0.80, 0.82, 0.81, 0.79, 0.80])
    assert sst2["p_wilcoxon"] == pytest.approx(stats.wilcoxon(np.round(d, 2), zero_method="pratt").pvalue)
    assert (sst2["n_positive"], sst2["n_negative"]) == (4, 1)
    # every run of both arms identical (e.g. all collapsed to one class): no p, no power, out of the family
    assert math.isnan(mrpc["p_value"]) and math.isnan(mrpc["mde"]) and math.isnan(mrpc["p_holm"])
    assert sst2["family_size"] == 1 and sst2["p_holm"] == pytest.approx(sst2["p_value"])
    pooled = pooled_gains(paired.reset_index()).iloc[0]
    assert pooled["k"] == 1 and pooled["interval"] == "not pooled" and math.isnan(pooled["mean"])


def test_the_random_intercept_slope_equals_statsmodels_mixedlm():
    import statsmodels.formula.api as smf

    seeds = np.repeat(np.arange(8), 7)
    lam = np.tile([-5, -3, -1, 0, 1, 3, 5], 8).astype(float)
    iso = 0.2 + 0.01 * lam + RNG.normal(0, 0.01, 56)
    score = 88 - 6.0 * iso + RNG.normal(0, 1.0, 8)[seeds] + RNG.normal(0, 0.8, 56)
    fit = random_intercept_slope(score, iso, seeds)
    frame = pd.DataFrame({"y": score, "x": iso, "seed": seeds})
    reference = smf.mixedlm("y ~ x", frame, groups=frame["seed"]).fit(reml=True)
    # both optimise the same REML criterion, each to its own tolerance: agreement to 1e-4 standard errors
    assert fit.estimate == pytest.approx(reference.params["x"], abs=1e-4 * fit.se)
    assert fit.intercept == pytest.approx(reference.params["Intercept"], abs=1e-4 * reference.bse["Intercept"])
    # the standard error is the generalised least-squares one, (XᵀV⁻¹X)⁻¹ at statsmodels' variance estimates
    # (as lme4 and nlme report it); statsmodels' own bse inverts the whole observed Hessian, variance terms
    # included, which differs in the third digit
    v = reference.scale * np.eye(56) + float(reference.cov_re.iloc[0, 0]) * (seeds[:, None] == seeds[None, :])
    design = np.column_stack([np.ones(56), iso])
    gls = np.linalg.inv(design.T @ np.linalg.solve(v, design))
    assert fit.se == pytest.approx(math.sqrt(gls[1, 1]), rel=1e-5)
    assert fit.se == pytest.approx(reference.bse["x"], rel=1e-2)
    assert (fit.ci_low, fit.ci_high) == pytest.approx(
        (fit.estimate - stats.norm.isf(0.025) * fit.se, fit.estimate + stats.norm.isf(0.025) * fit.se), rel=1e-12)
    assert fit.p_value == pytest.approx(2 * stats.norm.sf(abs(fit.estimate) / fit.se), rel=1e-12)
    assert fit.group_variance == pytest.approx(float(reference.cov_re.iloc[0, 0]), rel=1e-4)
    assert fit.residual_variance == pytest.approx(reference.scale, rel=1e-5)
    assert (fit.n, fit.groups) == (56, 8)
    with pytest.raises(ValueError, match="at least two groups"):
        random_intercept_slope(score[:7], iso[:7], seeds[:7])


def test_the_sweeps_slope_split_and_its_instrumental_variable_fit_equal_statsmodels():
    """On the dose-response study's λ sweep (docs/data): the slope of the score on IsoScore* between λ
    and within λ (seed fixed effects), and two-stage least squares with λ as the instrument."""
    import statsmodels.formula.api as smf
    from statsmodels.sandbox.regression.gmm import IV2SLS

    from istar.report.inference import treatment_slopes

    runs = pd.read_csv(Path(__file__).parents[3] / "docs/data/dose-response/runs.csv")
    sweep = runs[runs.study == "lambda_sweep"]
    data = pd.DataFrame({"y": sweep.score * 100, "x": sweep.isoscore_star, "lam": sweep.lam, "seed": sweep.seed})
    slopes = treatment_slopes(data.y, data.x, data.lam, data.seed)
    data["x_arm"] = data.groupby("lam").x.transform("mean")
    data["x_off"] = data.x - data.x_arm
    for name, formula, term in (("between", "y ~ x_arm + x_off + C(seed)", "x_arm"),
                                ("within", "y ~ x + C(lam) + C(seed)", "x")):
        fit = smf.ols(formula, data).fit()
        assert slopes[name].mean == pytest.approx(fit.params[term], rel=1e-9), name
        assert (slopes[name].ci_low, slopes[name].ci_high) == pytest.approx(tuple(fit.conf_int().loc[term]), rel=1e-9)
    seeds, arms = pd.get_dummies(data.seed, dtype=float), pd.get_dummies(data.lam, dtype=float).iloc[:, 1:]
    iv = IV2SLS(data.y, pd.concat([data[["x"]], seeds], axis=1), pd.concat([arms, seeds], axis=1)).fit()
    assert slopes["iv"].mean == pytest.approx(iv.params["x"], rel=1e-9)
    assert slopes["iv"].se == pytest.approx(iv.bse["x"], rel=1e-9) and slopes["iv"].df == iv.df_resid
    # the declared slope blends a flat part λ sets with a steep seed-to-seed part of the opposite sign
    assert abs(slopes["between"].mean) < 1 < slopes["within"].ci_low
