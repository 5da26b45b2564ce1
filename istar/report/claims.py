"""The claims table: each claim of the paper, what this study's numbers say about it, and at what power.

A reproduction's product is a verdict per claim. Each entry of :data:`CLAIMS` states one claim of
Rudman & Eickhoff (ICLR 2024) and judges it from the aggregate CSVs with the same tests the
tables print (:mod:`istar.report.paired`, :mod:`istar.report.inference`), at α = 0.05:

- **supported**: the test is significant in the claimed direction;
- **contradicted**: significant in the opposite direction (or, for a descriptive claim, the
  numbers go against it);
- **inconclusive**: not significant; the verdict then names the smallest effect the comparison
  would have detected with 80 % power (its minimum detectable effect), so "no significant
  difference" is never read as "no difference";
- **not tested**: this configuration has no runs that bear on the claim (e.g. no CosReg runs, or
  λ | ζ fixed in advance so that no search chose a sign).

Score differences are in points (×100 for fractions, SQuAD's F1 as is); IsoScore* and cosine
similarity in their own units. A claim judged on several cells uses the random-effects pooled
estimate of :func:`istar.report.paired.pooled_gains`; one judged per variant reports a row each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from istar.registry.methods import METHODS
from istar.registry.tasks import get_task
from istar.report.inference import ALPHA, POWER
from istar.report.paired import REFERENCE, format_p, paired_differences, pooled_gains
from istar.report.table_render import Table

__all__ = ["Evidence", "Finding", "Claim", "CLAIMS", "claims_table"]

SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED = "supported", "contradicted", "inconclusive", "not tested"


@dataclass(frozen=True)
class Evidence:
    """What the claims are judged on: ``runs.csv``, ``selection.csv`` (or None) and Fig. 2's
    simulation (``fig2_stability.csv``, or None when the study is off)."""

    runs: pd.DataFrame
    selection: pd.DataFrame | None = None
    stability: pd.DataFrame | None = None


@dataclass(frozen=True)
class Finding:
    """One row of the table: the cells it covers, the numbers, and the verdict."""

    scope: str
    numbers: str
    verdict: str


@dataclass(frozen=True)
class Claim:
    """A claim of the paper: ``key``, its ``statement`` with where the paper makes it, and ``judge``,
    which returns the findings for this study's evidence (empty: not tested, ``untested`` says why)."""

    key: str
    statement: str
    judge: Callable[[Evidence], list[Finding]]
    untested: str


def _pooled_verdict(estimate: float, p_value: float, mde: float, sign: int, unit: str, digits: int) -> str:
    if math.isnan(p_value):
        return f"{INCONCLUSIVE}: too few seeds for a test"
    if p_value < ALPHA:
        return SUPPORTED if estimate * sign > 0 else CONTRADICTED
    return f"{INCONCLUSIVE}: it could have detected {mde:.{digits}f}{unit} or more ({POWER:.0%} power)"


def _interval(row, digits: int, unit: str = "") -> str:
    return (f"{row['mean']:+.{digits}f}{unit} [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}], "
            f"p = {format_p(row['p_value'])}")


def _final(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["study"] == "final"]


def _pool(runs: pd.DataFrame, value: str, method: str, points: bool) -> pd.Series | None:
    """The pooled paired difference of ``value`` (method − Base) over the final study's cells, or None."""
    rows = _final(runs).dropna(subset=[value])
    if rows.empty or method not in set(rows["method"]) or REFERENCE not in set(rows["method"]):
        return None
    paired = paired_differences(rows.assign(score=rows[value]))
    paired = paired[paired["method"] == method]
    if paired.empty:
        return None
    scales = {task: (get_task(task).percent_scale if points else 1.0) for task in set(paired["task"])}
    pooled = pooled_gains(paired, scales)
    overall = pooled[pooled["scope"] == "all"].iloc[0]
    return None if overall["k"] == 0 else overall


def _istar_beats_base(evidence: Evidence) -> list[Finding]:
    pooled = _pool(evidence.runs, "score", "istar", points=True)
    if pooled is None:
        return []
    cells = (f"{pooled['positive_cells']} of {pooled['k']} cells above Base; Holm-significant: "
             f"{pooled['significant_gains']} gain(s), {pooled['significant_losses']} loss(es)")
    return [Finding(f"{pooled['k']} model × task cell(s), pooled",
                    f"I-STAR − Base {_interval(pooled, 2, ' points')} (random effects, τ² = {pooled['tau2']:.2f}); {cells}",
                    _pooled_verdict(pooled["mean"], pooled["p_value"], pooled["mde"], +1, " points", 2))]


def _negative_lambdas(evidence: Evidence) -> list[Finding]:
    selection = evidence.selection
    if selection is None or selection.empty:
        return []
    searched = selection[selection["protocol"] != "fixed"]
    if searched.empty:
        return []
    negative = int((searched["lam"].astype(float) < 0).sum())
    seeds = sorted(set(searched["seeds"].dropna().astype(int)))
    note = (" (one seed per setting: the choice is as noisy as a single run)" if seeds == [1] else "")
    verdict = SUPPORTED if negative == len(searched) else f"{CONTRADICTED} in {len(searched) - negative} cell(s)"
    return [Finding(f"{len(searched)} searched cell(s)",
                    f"the search chose λ < 0 in {negative} of {len(searched)}{note}", verdict)]


def _variant_rows(evidence: Evidence) -> pd.DataFrame:
    """Runs of I-STAR with λ < 0 beside Base, labelled by variant: the padding study's when it ran
    (real tokens and all positions), else the final study's."""
    from istar.report.padding_study import padding_rows

    runs = evidence.runs
    if (runs["study"] == "padding").any() and runs.loc[runs["study"] == "padding", "isoscore_star"].notna().any():
        rows = padding_rows(runs)
    else:
        rows = _final(runs)
        rows = rows.assign(variant=[METHODS[m].label for m in rows["method"]], study="padding")
    keep = (rows["method"] == REFERENCE) | ((rows["method"] == "istar") & (rows["lam"].astype(float) < 0))
    return rows[keep]


def _decreasing_isotropy_helps(evidence: Evidence) -> list[Finding]:
    rows = _variant_rows(evidence).dropna(subset=["isoscore_star"])
    base_label = METHODS[REFERENCE].label
    if rows.empty or not (rows["variant"] != base_label).any():
        return []
    frame = rows.assign(method=rows["variant"])
    scores = paired_differences(frame, study="padding", reference=base_label)
    isotropy = paired_differences(frame.assign(score=frame["isoscore_star"]), study="padding", reference=base_label)
    findings = []
    for score, iso in zip(scores.itertuples(), isotropy.itertuples()):
        scale = get_task(score.task).percent_scale
        lam = rows[(rows["variant"] == score.method) & (rows["task"] == score.task)]
        setting = f"λ = {lam['lam'].iloc[0]:g}, ζ = {lam['zeta'].iloc[0]:g}"
        scope = f"{score.model} {get_task(score.task).display}, {score.method} ({setting}), n = {score.n}"
        numbers = (f"IsoScore* {iso.mean_difference:+.3f} (Holm p = {format_p(iso.p_holm)}); score "
                   f"{score.mean_difference * scale:+.2f} points [{score.ci_low * scale:+.2f}, "
                   f"{score.ci_high * scale:+.2f}], Holm p = {format_p(score.p_holm)}")
        if not (iso.p_holm < ALPHA and iso.mean_difference < 0):
            verdict = f"{NOT_TESTED}: this variant did not lower the real tokens' IsoScore* significantly"
        else:
            verdict = _pooled_verdict(score.mean_difference, score.p_holm, score.mde * scale, +1, " points", 2)
        findings.append(Finding(scope, numbers, verdict))
    return findings


def _istar_lowers_isoscore(evidence: Evidence) -> list[Finding]:
    final = _final(evidence.runs)
    negative = final[(final["method"] != "istar") | (final["lam"].astype(float) < 0)]
    pooled = _pool(negative, "isoscore_star", "istar", points=False)
    if pooled is None:
        return []
    return [Finding(f"{pooled['k']} cell(s), pooled", f"I-STAR (λ < 0) − Base IsoScore* {_interval(pooled, 3)}",
                    _pooled_verdict(pooled["mean"], pooled["p_value"], pooled["mde"], -1, "", 3))]


def _cosreg_not_isotropic(evidence: Evidence) -> list[Finding]:
    cosine = _pool(evidence.runs, "cosine_similarity", "cosreg", points=False)
    isotropy = _pool(evidence.runs, "isoscore_star", "cosreg", points=False)
    if cosine is None or isotropy is None:
        return []
    lowered = cosine["p_value"] < ALPHA and cosine["mean"] < 0
    raised = isotropy["p_value"] < ALPHA and isotropy["mean"] > 0
    if lowered and not raised:
        verdict = (f"{SUPPORTED} (IsoScore* not raised; it could have detected a rise of "
                   f"{isotropy['mde']:.3f} or more)")
    elif raised:
        verdict = f"{CONTRADICTED}: CosReg raised IsoScore*"
    else:
        verdict = _pooled_verdict(cosine["mean"], cosine["p_value"], cosine["mde"], -1, "", 3)
    return [Finding(f"{cosine['k']} cell(s), pooled",
                    f"CosReg − Base: last-layer cosine {_interval(cosine, 3)}; IsoScore* {_interval(isotropy, 3)}",
                    verdict)]


def _stable_on_mini_batches(evidence: Evidence) -> list[Finding]:
    data = evidence.stability
    if data is None or data.empty:
        return []
    largest = data["batch_size"].max()
    reference = float(data[(data["batch_size"] == largest) & (data["zeta"] == 0)]["mean"].iloc[0])
    smallest = data[data["batch_size"] == data["batch_size"].min()].set_index("zeta")["mean"]
    plain = abs(float(smallest.loc[0.0]) - reference)
    shrunk = {zeta: abs(float(value) - reference) for zeta, value in smallest.items() if zeta > 0}
    best_zeta = min(shrunk, key=shrunk.get)
    verdict = SUPPORTED if all(error < plain for error in shrunk.values()) else CONTRADICTED
    return [Finding(f"Fig. 2 simulation, batches of {int(data['batch_size'].min())}",
                    f"|error| of IsoScore (ζ = 0) {plain:.3f} vs IsoScore* {min(shrunk.values()):.3f} "
                    f"(ζ = {best_zeta:g}) against the value at {int(largest):,} points ({reference:.3f})", verdict)]


CLAIMS: tuple[Claim, ...] = (
    Claim("istar_beats_base", "I-STAR improves on the baseline (Table 1: best in most cells; a mean gain of 0.35 "
          "points over its 27 cells)", _istar_beats_base, "no final I-STAR and Base runs with two or more seeds"),
    Claim("negative_lambda", "The best λ are negative: decreasing isotropy is what helps (Table 2)",
          _negative_lambdas, "λ | ζ fixed in advance (final.istar): no search chose a sign"),
    Claim("decreasing_isotropy_helps", "Decreasing the isotropy of the representations improves performance "
          "(§5–6)", _decreasing_isotropy_helps, "no measured I-STAR runs with λ < 0 beside Base"),
    Claim("istar_lowers_isoscore", "I-STAR with λ < 0 lowers the IsoScore* of the fine-tuned model (Fig. 6)",
          _istar_lowers_isoscore, "no measured final I-STAR runs with λ < 0"),
    Claim("cosreg_not_isotropic", "CosReg lowers the average cosine similarity without making the space "
          "isotropic (Fig. 4)", _cosreg_not_isotropic, "no measured final CosReg runs"),
    Claim("stable_on_mini_batches", "IsoScore* of a mini-batch is close to the point cloud's while IsoScore "
          "underestimates it (Fig. 2)", _stable_on_mini_batches, "the Fig. 2 simulation is off (studies.stability)"),
)
"""The claims, in the order of the table."""


def claims_table(runs: pd.DataFrame, selection: pd.DataFrame | None = None,
                 stability: pd.DataFrame | None = None) -> Table:
    """The claims table: per claim of :data:`CLAIMS`, each finding's scope, numbers and verdict.

    Parameters
    ----------
    runs, selection : ``runs.csv`` and ``selection.csv`` of ``istar aggregate`` (selection may be None).
    stability : ``fig2_stability.csv`` of ``istar stability``, or None.

    Returns
    -------
    Table with rows claim × finding (a claim without evidence gets one "not tested" row) and the
    columns ``Cells``, ``Numbers``, ``Verdict``.
    """
    evidence = Evidence(runs, selection, stability)
    index, cells = [], []
    for claim in CLAIMS:
        findings = claim.judge(evidence) or [Finding("–", claim.untested, NOT_TESTED)]
        for finding in findings:
            index.append([claim.statement])
            cells.append([finding.scope, finding.numbers, finding.verdict])
    return Table(
        name="claims",
        caption="The paper's claims and what this study's numbers say about each, at its power.",
        index_names=["Claim"],
        index=index,
        columns=["Cells", "Numbers", "Verdict"],
        standin=[False] * 3,
        cells=cells,
        best=[[False] * 3 for _ in cells],
        footnotes=[
            f"Tests at α = {ALPHA:g}, two-sided, paired by seed. supported / contradicted: significant in / against "
            f"the claimed direction; inconclusive: not significant, with the smallest effect the comparison detects "
            f"with {POWER:.0%} power (below it, a real effect can hide); not tested: no runs here bear on it. "
            "Pooled: DerSimonian–Laird random-effects mean over the cells (points for scores). Per-variant rows use "
            "the Holm-adjusted p-values of the padding table's families.",
        ],
    )
