"""A study's confirmatory tests, as one family: each comparison gets one adjusted p wherever it is shown.

The tables, the claims and ``paired.csv`` / ``trend.csv`` all read :func:`study_tests`, so a
comparison printed in Table 1, in the padding table and in the claims table carries the same
Holm-adjusted p-value and the same minimum detectable effect. The family is every test a verdict
can be drawn from:

- the final study's paired comparisons of each method with Base, per model × task, on the score,
  on the fine-tuned model's IsoScore* and on its last layer's cosine similarity (where measured);
- the padding study's I-STAR variants against Base, on the score and on IsoScore*;
- the λ sweep's trends (:func:`trend_tests`): per model × task the slope of the score (points) on
  the fine-tuned model's IsoScore*, and on λ, each from a linear mixed model with the seed as a
  random intercept (:func:`istar.report.inference.random_intercept_slope`). The paper's claim
  (Fig. 3: "decreasing isotropy improves performance") is a negative slope on IsoScore*.

The adjustment follows the declared multiplicity plan (``inference.multiplicity``,
:data:`istar.report.family.MULTIPLICITY_PLANS`): one Holm family of the m tests, each detectable effect
stated at α / m, the level Holm's first step tests at; or gatekeeping, the declared primary alone at α
and the others Holm-adjusted among themselves at α / (m − 1), passing only where the primary does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from istar.core.tokens import TOKEN_SELECTIONS
from istar.registry.methods import BASELINE_METHOD, METHODS
from istar.registry.tasks import get_task
from istar.report.family import FAMILY_MEASURES, MULTIPLICITY_PLANS, TREND_COVARIATES, TREND_STUDY, MultiplicityPlan
from istar.report.inference import POWER, random_intercept_slope
from istar.report.paired import LEVEL, PAIRED_COLUMNS, adjust_family, informative, paired_differences
from istar.report.paper import PAPER_MODELS, Estimate, difference, paper_gain

__all__ = ["TREND_COLUMNS", "PAPER_COLUMNS", "STUDY_PAIRED_COLUMNS", "StudyTests", "variant_label",
           "trend_tests", "study_tests", "paper_comparisons"]


TREND_COLUMNS = ("study", "model", "task", "covariate", "n", "groups", "slope", "se", "ci_low", "ci_high", "level",
                 "p_value", "p_holm", "significant", "mde", "mde_alpha", "family_size", "group_variance",
                 "residual_variance", "lambdas")
"""Columns of ``trend.csv``: the slope in points per unit of the covariate, its Wald interval and test."""

PAPER_COLUMNS = ("paper_model", "paper_gain", "paper_low", "paper_high", "paper_p", "gap", "gap_low", "gap_high",
                 "gap_mde", "consistent")
"""Columns :func:`study_tests` adds to the final study's score rows of ``paired.csv``: the paper's own cell
(:func:`paper_comparisons`), in points; empty elsewhere."""

STUDY_PAIRED_COLUMNS = (*PAIRED_COLUMNS, *PAPER_COLUMNS)
"""Columns of ``paired.csv``."""


def variant_label(method: str, tokens: str) -> str:
    """``Base``, ``I-STAR, real tokens``, ``I-STAR, all positions``: a padding-study arm's name."""
    label = METHODS[method].label
    return f"{label}, {TOKEN_SELECTIONS[tokens].label}" if METHODS[method].takes("tokens") else label


@dataclass(frozen=True)
class StudyTests:
    """The study's family of tests: ``paired`` (:data:`istar.report.paired.PAIRED_COLUMNS`) and
    ``trends`` (:data:`TREND_COLUMNS`), adjusted together under ``plan`` (``inference.multiplicity``)
    with ``primary`` (``inference.primary``, None where none is declared) opening its gate."""

    paired: pd.DataFrame
    trends: pd.DataFrame
    plan: MultiplicityPlan
    primary: dict | None

    def is_primary(self, contrast: str, model: str, task: str) -> bool:
        """Whether ``contrast`` (a method, or the λ sweep's trend) on ``model`` × ``task`` is the declared primary."""
        primary = self.primary
        return primary is not None and (primary["contrast"], primary["model"], primary["task"]) == (contrast, model, task)

    def rows(self, study: str, measure: str = "score") -> pd.DataFrame:
        """The paired comparisons of one study and measure."""
        return self.paired[(self.paired["study"] == study) & (self.paired["measure"] == measure)]

    def cells(self, study: str, measure: str = "score") -> dict[tuple[str, str, str], object]:
        """(model, method, task) → that comparison's row, for table cells."""
        return {(row.model, row.method, row.task): row for row in self.rows(study, measure).itertuples()}

    @property
    def family_size(self) -> int:
        return int(self.paired["p_value"].notna().sum() + self.trends["p_value"].notna().sum())


def _paired_parts(runs: pd.DataFrame, level: float) -> list[pd.DataFrame]:
    parts = []
    for study, measures in FAMILY_MEASURES.items():
        rows = runs[runs["study"] == study]
        if rows.empty:  # e.g. no padding study: its runs, and their token selections, are absent
            continue
        if study == "padding":  # its two I-STAR arms differ by token selection: each is compared as an arm
            rows = rows.assign(method=[variant_label(m, t) for m, t in zip(rows["method"], rows["tokens"])])
        reference = METHODS[BASELINE_METHOD].label if study == "padding" else BASELINE_METHOD
        for measure in measures:
            if measure in rows and rows[measure].notna().any():
                parts.append(paired_differences(rows.assign(score=rows[measure]), study, reference, level, measure))
    return parts


def trend_tests(runs: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """The λ sweep's trends, before the family's adjustment (``p_holm`` and ``mde`` NaN).

    Per model × task of the ``lambda_sweep`` study's measured runs (λ = 0 is Base): the slope of the
    score in points on each of :data:`TREND_COVARIATES`, the seed a random intercept. A cell with
    fewer than two seeds or one λ is left out.
    """
    rows = runs[(runs["study"] == TREND_STUDY)].dropna(subset=["score"])
    out = []
    for (model, task), cell in rows.groupby(["model", "task"], sort=False):
        lam = cell["lam"].fillna(0.0).astype(float)
        for covariate in TREND_COVARIATES:
            x = lam if covariate == "lam" else cell[covariate].astype(float)
            usable = x.notna()
            if cell.loc[usable, "seed"].nunique() < 2 or lam[usable].nunique() < 2:
                continue
            points = cell.loc[usable, "score"].astype(float) * get_task(task).percent_scale
            fit = random_intercept_slope(points.to_numpy(), x[usable].to_numpy(), cell.loc[usable, "seed"].to_numpy(),
                                         alpha=1 - level)
            out.append({"study": TREND_STUDY, "model": model, "task": task, "covariate": covariate, "slope": fit.estimate,
                        **{key: value for key, value in asdict(fit).items() if key in TREND_COLUMNS},
                        "level": level, "lambdas": " ".join(f"{v:g}" for v in sorted(set(lam[usable])))})
    return pd.DataFrame(out, columns=list(TREND_COLUMNS))


def study_tests(runs: pd.DataFrame, inference: dict | None = None, level: float = LEVEL) -> StudyTests:
    """Every confirmatory test of the study in ``runs.csv``, adjusted as one family (module docstring).

    Parameters
    ----------
    runs : ``runs.csv`` of ``istar aggregate``.
    inference : the config's ``inference`` section: ``multiplicity`` (the plan), ``primary`` (the test
        that opens the gate) and ``paper_models`` (model → the paper's model set beside it); a key left
        out, or None, takes the schema's default.
    level : coverage of the intervals; α = 1 − level.

    Returns
    -------
    :class:`StudyTests`; ``paired`` has :data:`STUDY_PAIRED_COLUMNS` (empty when no study has pairs).
    """
    from scipy import stats

    from istar.config.schema import default_of

    declared = {key: default_of(f"inference.{key}") for key in ("multiplicity", "primary", "paper_models")}
    declared |= {key: value for key, value in (inference or {}).items() if key in declared}
    parts = _paired_parts(runs, level)
    paired = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(PAIRED_COLUMNS))
    trends = trend_tests(runs, level)
    extra = trends["p_value"].to_numpy(dtype=float)
    plan, gate = MULTIPLICITY_PLANS[declared["multiplicity"]], None
    if plan.gates:
        gate = _primary_position(paired, trends, declared["primary"])
        if gate is None:  # the primary has no test here: it stays in the family, untested, and the gate shut
            gate, extra = len(paired) + len(trends), np.append(extra, np.nan)
    paired, trend_holm, trend_levels = adjust_family(paired, level, extra_p_values=extra, gate=gate)
    trends["p_holm"], trends["mde_alpha"] = trend_holm[:len(trends)], trend_levels[:len(trends)]
    trends["significant"] = trends["p_holm"] < 1 - level
    trends["family_size"] = int(paired["p_value"].notna().sum() + np.count_nonzero(~np.isnan(extra)))
    trends["mde"] = (stats.norm.isf(trends["mde_alpha"] / 2) + float(stats.norm.ppf(POWER))) * trends["se"]
    paper = paper_comparisons(paired, declared["paper_models"], level)
    return StudyTests(paired=paired.join(paper).reindex(columns=list(STUDY_PAIRED_COLUMNS)), trends=trends, plan=plan,
                      primary=declared["primary"])


def _primary_position(paired: pd.DataFrame, trends: pd.DataFrame, primary: dict) -> int | None:
    """The declared primary's index in the family [paired rows, trends] (``inference.primary``: a final
    cell's score comparison, or the λ sweep's trend on IsoScore*, :data:`TREND_COVARIATES`' first); None
    where it has no row."""
    if primary["contrast"] == TREND_STUDY:
        rows, offset = trends[trends["covariate"] == TREND_COVARIATES[0]], len(paired)
    else:
        rows, offset = paired[(paired["study"] == "final") & (paired["measure"] == "score")
                              & (paired["method"] == primary["contrast"])], 0
    found = np.flatnonzero((rows["model"] == primary["model"]).to_numpy() & (rows["task"] == primary["task"]).to_numpy())
    return offset + int(rows.index[found[0]]) if len(found) else None


def paper_comparisons(paired: pd.DataFrame, mapping: dict[str, str], level: float = LEVEL) -> pd.DataFrame:
    """Each final cell's gain beside the paper's own cell for the model it maps to.

    Parameters
    ----------
    paired : rows of :func:`istar.report.paired.paired_differences`; the final study's score rows are used.
    mapping : ``inference.paper_models`` (model short name → albert, bert or distilbert).

    Returns
    -------
    DataFrame with :data:`PAPER_COLUMNS` on the index of ``paired`` (points): ``paper_gain`` (the
    paper's gain, Welch, :mod:`istar.report.paper`) with its interval and p-value, ``gap`` = ours −
    the paper's with its interval, ``gap_mde`` (the smallest |gap| its test detects with 80 % power at
    the interval's level, :meth:`istar.report.paper.Estimate.detectable`) and ``consistent`` (the gap's
    interval holds 0). Rows without a
    paper model, a paper cell or an informative comparison are left out.
    """
    alpha = 1 - level
    out = {}
    chosen = paired[(paired["study"] == "final") & (paired["measure"] == "score")] if len(paired) else paired
    for index, row in chosen.iterrows():
        # its entry in the mapping, else the model itself where it is one of the paper's, else none (not compared)
        theirs_model = mapping.get(row["model"], row["model"] if row["model"] in PAPER_MODELS else None)
        theirs = paper_gain(theirs_model, row["task"], row["method"], alpha) if theirs_model else None
        if theirs is None or not informative(row):
            continue
        scale = get_task(row["task"]).percent_scale
        n = int(row["n"])
        ours = Estimate.of(row["mean_difference"] * scale, row["sd_difference"] * scale / math.sqrt(n), n - 1, alpha)
        gap = difference(ours, theirs, alpha)
        out[index] = {"paper_model": theirs_model, "paper_gain": theirs.mean, "paper_low": theirs.ci_low,
                      "paper_high": theirs.ci_high, "paper_p": theirs.p_value, "gap": gap.mean, "gap_low": gap.ci_low,
                      "gap_high": gap.ci_high, "gap_mde": gap.detectable(alpha, POWER), "consistent": gap.holds_zero}
    return pd.DataFrame.from_dict(out, orient="index", columns=list(PAPER_COLUMNS))
