"""The claims table: each claim of the paper, what this study's numbers say about it, and at what power.

A reproduction's product is a verdict per claim. Each entry of :data:`CLAIMS` states one claim of
Rudman & Eickhoff (ICLR 2024) and judges it from the study's one family of tests
(:func:`istar.report.comparisons.study_tests`: every comparison carries one adjusted p under the
declared multiplicity plan, ``inference.multiplicity``, the same as in the tables), at α = 0.05:

- **supported**: the test is significant in the claimed direction after the adjustment;
- **contradicted**: significant in the opposite direction (or, for a descriptive claim, the
  numbers go against it);
- **inconclusive**: not significant; the verdict then names the smallest effect the comparison
  would have detected with 80 % power at the level its test needs at worst (α / m in one Holm
  family; gatekeeping: α for the primary, α / (m − 1) for a secondary), so "no significant
  difference" is never read as "no difference";
- **not informative**: the comparison has no information (its pairs do not vary, or fewer than
  two remain): no test, no power;
- **not tested**: this configuration has no runs that bear on it.

What a claim is judged on is declared in the config (``inference.primary``): a claim about the
declared primary contrast (I-STAR − Base, CosReg − Base, or the λ sweep's trend) is judged on that
cell alone; a claim across cells on the pooled estimate over the informative cells
(Hartung–Knapp–Sidik–Jonkman below five cells; one cell is reported by its own paired test, never
as "pooled"). Every verdict names its scope: the model and task, the training rows and epochs, and
where λ | ζ came from; every interval is printed at 95 % and, where the plan tests the verdict at a stricter
level, at Holm's first-step level too (α / m; gatekeeping: α / (m − 1) for a secondary), the level no test
of the family falls below. The signed-rank test beside each t-test is adjusted over the same family; where the two
disagree at α, or where its n pairs cannot reach the verdict's level at all, the verdict says so.
The paper's own cell for the model the config maps each model to (``inference.paper_models``) is set
beside ours (:mod:`istar.report.paper`).

Score differences are in points (×100 for fractions, SQuAD's F1 as is); IsoScore* and cosine
similarity in their own units.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from istar.registry.methods import METHODS, SEARCHED_METHOD
from istar.registry.tasks import get_task
from istar.report.evidence import Evidence, Finding
from istar.report.family import ALPHA, signed_rank_pairs_needed, smallest_signed_rank_p, verdict_levels
from istar.report.inference import POWER, treatment_slopes
from istar.report.paired import format_p, informative, paired_interval, pooled_gains
from istar.report.paper import Estimate
from istar.report.table_render import Table

__all__ = ["Claim", "CLAIMS", "claims_table"]

SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED = "supported", "contradicted", "inconclusive", "not tested"
NOT_INFORMATIVE = "not informative"

PRIMARY = " (the declared primary endpoint)"
"""What ends the scope of the finding the declared primary endpoint is judged on."""

COSREG = METHODS["cosreg"].key
"""The method the paper's Fig. 4 claim is about."""

LAST_LAYER = "last_layer_isoscore_star"
"""The paper's quantity for CosReg's claim (runs.csv): the IsoScore* of the fine-tuned model's last layer."""

ISOTROPIC_FROM = 0.5
"""IsoScore* at or above which a space counts as made isotropic: IsoScore* is about the share of its
dimensions a point cloud uses evenly (1: every one), so below one half it uses fewer than half."""


@dataclass(frozen=True)
class Claim:
    """A claim of the paper: ``key``, its ``statement`` with where the paper makes it, and ``judge``,
    which returns the findings for this study's evidence (empty: not tested, ``untested`` says why)."""

    key: str
    statement: str
    judge: Callable[[Evidence], list[Finding]]
    untested: str


def _verdict(estimate: float, p_value: float, mde: float, sign: int, unit: str, digits: int, row=None) -> str:
    """The verdict of a test in the claimed direction ``sign``; ``row`` (a paired comparison) adds where
    its signed-rank test stands at the level of the verdict (:func:`_rank_note`)."""
    if math.isnan(p_value):
        return f"{NOT_INFORMATIVE}: no test"
    if p_value < ALPHA:
        verdict = SUPPORTED if estimate * sign > 0 else CONTRADICTED
    else:
        verdict = f"{INCONCLUSIVE}: it could have detected {mde:.{digits}f}{unit} or more ({POWER:.0%} power)"
    return verdict + ("" if row is None else _rank_note(row))


def _rank_note(row) -> str:
    """The signed-rank test at the verdict's level: where its n pairs cannot reach the row's level (``mde_alpha``,
    step), or where its Holm-adjusted p and the t-test's fall on opposite sides of α; else nothing."""
    level = row.mde_alpha
    if smallest_signed_rank_p(row.n) >= level:
        return (f"; the signed-rank test cannot pass at this level: with {row.n} pairs its smallest p is "
                f"{smallest_signed_rank_p(row.n):.4f}, not below its verdict's level {level:.4f} (it needs "
                f"{signed_rank_pairs_needed(level)} pairs)")
    if not math.isnan(row.p_wilcoxon_holm) and (row.p_holm < ALPHA) != (row.p_wilcoxon_holm < ALPHA):
        return (f"; at this level the t-test and the signed-rank test disagree (Holm {_p(row.p_holm)} and "
                f"{_p(row.p_wilcoxon_holm)})")
    return ""


def _p(value: float) -> str:
    """``p = 0.031``, ``p < 0.001``, or ``p –`` where there is no test."""
    if math.isnan(value):
        return "p –"
    text = format_p(value)
    return f"p {text[0]} {text[1:]}" if text.startswith("<") else f"p = {text}"


def _at_verdict_level(mean: float, se: float, df: float, alpha: float, digits: int) -> str:
    """``, [−0.34, +0.48] at Holm's first-step level (99.4%)``: the interval at the level the plan tests the
    verdict at worst (the row's ``mde_alpha``; Student's t with ``df``, the normal where df is infinite), beside
    the 95 % one; empty where the verdict is tested at α, the printed interval's own level."""
    if round(alpha, 12) >= ALPHA:  # 1 − 0.95 is α up to rounding
        return ""
    at = Estimate.of(mean, se, df, alpha)
    return f", [{at.ci_low:+.{digits}f}, {at.ci_high:+.{digits}f}] at Holm's first-step level ({1 - alpha:.1%})"


def _cell_finding(evidence: Evidence, row, sign: int, points: bool, label: str, digits: int, unit: str,
                  primary: bool = False) -> Finding:
    """A finding from one cell's paired comparison (a row of the family's paired table)."""
    scale = get_task(row.task).percent_scale if points else 1.0
    scope = evidence.scope(row.model, row.task, row.method) + (PRIMARY if primary else "")
    cells = ((row.model, row.task),)
    if not informative(row):
        return Finding(scope, f"{label} {row.mean_difference * scale:+.{digits}f}{unit} over n = {row.n} pair(s)",
                       f"{NOT_INFORMATIVE}: " + ("fewer than two pairs" if row.n < 2 else
                                                 "every pair differs by the same amount (no variation to test)"),
                       cells)
    numbers = (f"{label} {row.mean_difference * scale:+.{digits}f}{unit} [{row.ci_low * scale:+.{digits}f}, "
               f"{row.ci_high * scale:+.{digits}f}] ({row.level:.0%})"
               + _at_verdict_level(row.mean_difference * scale, row.sd_difference * scale / math.sqrt(row.n), row.n - 1,
                                   row.mde_alpha, digits)
               + f", n = {row.n} ({row.n_positive} above 0, "
               f"{row.n_negative} below), "
               f"{_p(row.p_value)}, signed-rank {_p(row.p_wilcoxon)}, Holm {_p(row.p_holm)} (signed-rank "
               f"{_p(row.p_wilcoxon_holm)}; family of {row.family_size}, its level {row.mde_alpha:.4f})")
    return Finding(scope, numbers, _verdict(row.mean_difference, row.p_holm, row.mde * scale, sign, unit, digits, row),
                   cells)


def _across_cells(evidence: Evidence, rows: pd.DataFrame, method: str, sign: int, label: str, points: bool = False,
                  digits: int = 3, unit: str = "") -> list[Finding]:
    """A claim across the final study's cells (``rows``: one measure's paired comparisons): the declared primary
    cell when this is its contrast, else the pooled estimate over the informative cells (one cell: its own test;
    none: each cell, not informative). ``points``: the score, in points, where the primary can be."""
    rows = rows[rows["method"] == method]  # none: no finding (the steps below give an empty list)
    primary = [row for row in rows.itertuples() if points and evidence.tests.is_primary(method, row.model, row.task)]
    if primary:
        return [_cell_finding(evidence, primary[0], sign, points, label, digits, unit, primary=True)]
    cells = [row for row in rows.itertuples() if informative(row)]
    if len(cells) < 2:  # one informative cell: its own test; none: every cell, each not informative
        return [_cell_finding(evidence, row, sign, points, label, digits, unit)
                for row in cells or list(rows.itertuples())]
    pooled = pooled_gains(rows)
    overall = pooled[pooled["scope"] == "all"].iloc[0]
    name = "Hartung–Knapp–Sidik–Jonkman" if overall["interval"] == "HKSJ" else "DerSimonian–Laird"
    numbers = (f"{label} {overall['mean']:+.{digits}f}{unit} [{overall['ci_low']:+.{digits}f}, "
               f"{overall['ci_high']:+.{digits}f}] ({1 - ALPHA:.0%}), {_p(overall['p_value'])} (random effects, {name}, "
               f"τ² = {overall['tau2']:.2f}); "
               f"{overall['positive_cells']} of {overall['k']} cells above Base; Holm-significant: "
               f"{overall['significant_gains']} gain(s), {overall['significant_losses']} loss(es)")
    scope = f"{overall['k']} cells pooled: " + "; ".join(evidence.scope(row.model, row.task, row.method) for row in cells)
    return [Finding(scope, numbers, _verdict(overall["mean"], overall["p_value"], overall["mde"], sign, unit, digits),
                    tuple((row.model, row.task) for row in cells))]


def _beside_paper(evidence: Evidence, findings: list[Finding], method: str) -> list[Finding]:
    """Each finding's numbers with the paper's own cells for the cells it covers."""
    paper = evidence.tests.rows("final").dropna(subset=["paper_model"])
    paper = paper[paper["method"] == method]
    out = []
    for finding in findings:
        rows = [row for row in paper.itertuples() if (row.model, row.task) in finding.cells]
        notes = "; ".join(
            f"the paper's {row.paper_model} {get_task(row.task).display}: {row.paper_gain:+.2f} [{row.paper_low:+.2f}, "
            f"{row.paper_high:+.2f}] ({_p(row.paper_p)}), ours − the paper's {row.gap:+.2f} "
            f"[{row.gap_low:+.2f}, {row.gap_high:+.2f}] ({row.level:.0%}): "
            f"{'not distinguishable' if row.consistent else 'distinguishable'}; it could detect a gap of "
            f"{row.gap_mde:.2f} points or more ({POWER:.0%} power) between estimands that differ in the model "
            f"({row.model} and {row.paper_model}), the training rows and epochs, and the paper's λ | ζ chosen on "
            "its dev sets" for row in rows)
        out.append(replace(finding, numbers=f"{finding.numbers}. Beside: {notes}") if rows else finding)
    return out


def _istar_beats_base(evidence: Evidence) -> list[Finding]:
    findings = _across_cells(evidence, evidence.tests.rows("final", "score"), SEARCHED_METHOD, +1, "I-STAR − Base",
                             True, 2, " points")
    return _beside_paper(evidence, findings, SEARCHED_METHOD)


def _negative_lambdas(evidence: Evidence) -> list[Finding]:
    selection = evidence.selection
    searched = None if selection is None else selection[selection["protocol"] != "fixed"]
    if searched is None or searched.empty:
        return []
    negative = int((searched["lam"].astype(float) < 0).sum())
    seeds = sorted(set(searched["seeds"].dropna().astype(int)))
    note = (" (one seed per setting: the choice is as noisy as a single run)" if seeds == [1] else "")
    verdict = SUPPORTED if negative == len(searched) else f"{CONTRADICTED} in {len(searched) - negative} cell(s)"
    return [Finding(f"{len(searched)} searched cell(s)",
                    f"the search chose λ < 0 in {negative} of {len(searched)}{note}", verdict)]


def _trend(evidence: Evidence) -> list[Finding]:
    """The λ sweep's trend per cell: the slope of the score on IsoScore* (claimed negative), with λ's."""
    trends, runs = evidence.tests.trends, evidence.runs
    findings = []
    for (model, task), cell in trends.groupby(["model", "task"], sort=False):
        by = {row.covariate: row for row in cell.itertuples()}
        if "isoscore_star" not in by:
            continue
        iso = by["isoscore_star"]
        sweep = runs[(runs["study"] == "lambda_sweep") & (runs["model"] == model) & (runs["task"] == task)]
        numbers = (f"slope of the score on IsoScore* {iso.slope / 10:+.2f} points per +0.1 "
                   f"[{iso.ci_low / 10:+.2f}, {iso.ci_high / 10:+.2f}] ({iso.level:.0%})"
                   + _at_verdict_level(iso.slope / 10, iso.se / 10, math.inf, iso.mde_alpha, 2)
                   + f", {_p(iso.p_value)}, Holm {_p(iso.p_holm)} (family of {iso.family_size}, its level "
                   f"{iso.mde_alpha:.4f}); {iso.n} runs, λ ∈ {{{iso.lambdas}}}, "
                   f"{iso.groups} seeds (random intercepts)")
        if "lam" in by:
            lam = by["lam"]
            numbers += (f". Added after the run (IsoScore* is an outcome of the run, λ its treatment): the "
                        f"dose-response on λ, the causal contrast, "
                        f"{lam.slope:+.3f} points per unit [{lam.ci_low:+.3f}, {lam.ci_high:+.3f}] ({lam.level:.0%})"
                        + _at_verdict_level(lam.slope, lam.se, math.inf, lam.mde_alpha, 3)
                        + f", Holm {_p(lam.p_holm)}; " + _split_slope(sweep, task))
        primary = evidence.tests.is_primary("lambda_sweep", model, task)
        zetas = "/".join(f"{z:g}" for z in sorted(set(sweep["zeta"].dropna().astype(float)))) or "–"
        scope = f"{evidence.scope(model, task)}, the λ sweep at ζ = {zetas}" + (PRIMARY if primary else "")
        verdict = _verdict(iso.slope, iso.p_holm, iso.mde / 10, -1, " points per +0.1 IsoScore*", 2)
        findings.append(Finding(scope, numbers, verdict))
    return findings


def _split_slope(sweep: pd.DataFrame, task: str) -> str:
    """The IsoScore* slope split into what λ sets and the seed-to-seed rest, and its two-stage least-squares
    fit with λ as the instrument (:func:`istar.report.inference.treatment_slopes`), 95 % intervals, descriptive.
    ``sweep``: the λ sweep's runs of one model × task."""
    sweep = sweep.dropna(subset=["score", "isoscore_star"])
    try:
        slopes = treatment_slopes(sweep["score"] * get_task(task).percent_scale, sweep["isoscore_star"],
                                  sweep["lam"].fillna(0.0), sweep["seed"])
    except ValueError:
        return "too few runs to split the IsoScore* slope by λ"
    between, within, iv = (f"{slopes[part].mean / 10:+.2f} [{slopes[part].ci_low / 10:+.2f}, "
                           f"{slopes[part].ci_high / 10:+.2f}]" for part in ("between", "within", "iv"))
    return (f"the IsoScore* slope per +0.1 split (descriptive, 95 %): across λ {between}, within λ (seed to seed, "
            f"observational) {within}; two-stage least squares with λ as the instrument {iv}")


def _decreasing_isotropy_helps(evidence: Evidence) -> list[Finding]:
    """The trend across λ where the sweep ran; else the padding study's I-STAR arms (λ < 0) against Base;
    else the final study's."""
    trend = _trend(evidence)
    if trend:
        return trend
    padding = _lowered_then_scored(evidence, "padding")
    return padding if padding or not evidence.tests.rows("padding").empty else _lowered_then_scored(evidence, "final")


def _lowered_then_scored(evidence: Evidence, study: str) -> list[Finding]:
    """Each I-STAR arm of ``study`` trained with λ < 0 against Base on the score, judged where the arm
    lowered IsoScore* significantly (a padding arm is named by its token selection)."""
    scores, isotropy = evidence.tests.rows(study, "score"), evidence.tests.cells(study, "isoscore_star")
    istar = evidence.runs[(evidence.runs["study"] == study) & (evidence.runs["method"] == SEARCHED_METHOD)]
    findings = []
    for row in scores.itertuples():
        iso = isotropy.get((row.model, row.method, row.task))
        lam = istar[(istar["model"] == row.model) & (istar["task"] == row.task)]["lam"].astype(float)
        if iso is None or lam.empty or (lam >= 0).any() or row.method in set(METHODS) - {SEARCHED_METHOD}:
            continue
        label = METHODS[row.method].label if row.method in METHODS else row.method
        finding = _cell_finding(evidence, row, +1, True, f"{label} − Base", 2, " points")
        numbers = f"IsoScore* {iso.mean_difference:+.3f} (Holm {_p(iso.p_holm)}); {finding.numbers}"
        verdict = (finding.verdict if iso.p_holm < ALPHA and iso.mean_difference < 0 else
                   f"{NOT_TESTED}: {label} did not lower IsoScore* significantly here")
        findings.append(Finding(finding.scope + ("" if row.method in METHODS else f", {label}"), numbers, verdict))
    return findings


def _istar_lowers_isoscore(evidence: Evidence) -> list[Finding]:
    rows = evidence.tests.rows("final", "isoscore_star")
    lams = evidence.runs[(evidence.runs["study"] == "final") & (evidence.runs["method"] == SEARCHED_METHOD)]
    negative = {(m, t) for (m, t), lam in lams.groupby(["model", "task"])["lam"] if (lam.astype(float) < 0).all()}
    if rows.empty or not negative:
        return []
    rows = rows[[(m, t) in negative for m, t in zip(rows["model"], rows["task"])]]
    return _across_cells(evidence, rows, SEARCHED_METHOD, -1, "I-STAR (λ < 0) − Base IsoScore*")


def _cosreg_not_isotropic(evidence: Evidence) -> list[Finding]:
    """The claim in its three parts, on the paper's quantity, the last layer: the cosine lowered (against
    Base); its IsoScore* not changed (against Base); and not made isotropic (CosReg's own IsoScore*, far
    below 1)."""
    cosine = _across_cells(evidence, evidence.tests.rows("final", "cosine_similarity"), COSREG, -1,
                           "CosReg − Base last-layer cosine")
    if not cosine:
        return []
    findings = [replace(finding, scope=f"the cosine lowered: {finding.scope}") for finding in cosine]
    against_base = _across_cells(evidence, evidence.tests.rows("final", LAST_LAYER), COSREG, +1,
                                 "CosReg − Base last-layer IsoScore*")
    if not against_base:
        return findings + [Finding("the last layer's isotropy", f"no last-layer IsoScore* in these runs (runs.csv "
                                   f"{LAST_LAYER}, from the measurements)", NOT_TESTED)]
    for change in against_base:
        if change.verdict.startswith((SUPPORTED, CONTRADICTED)):  # significant either way: the isotropy moved
            kept = f"{CONTRADICTED}: CosReg changed it"
        elif change.verdict.startswith(INCONCLUSIVE):
            kept = f"{SUPPORTED} as far as the test sees: not distinguishable from Base;" + change.verdict.partition(":")[2]
        else:
            kept = change.verdict
        findings.append(replace(change, scope=f"isotropy unchanged: {change.scope}", verdict=kept))
    runs = evidence.runs
    level = 1 - verdict_levels(evidence.tests.plan.gates, evidence.tests.family_size)[1]  # a secondary's, at worst
    for (model, task), own in runs[(runs["study"] == "final") & (runs["method"] == COSREG)].dropna(
            subset=[LAST_LAYER]).groupby(["model", "task"], sort=False):
        mean, _, low, high = paired_interval(own[LAST_LAYER].to_numpy(dtype=float), level)
        verdict = (SUPPORTED if high < ISOTROPIC_FROM else CONTRADICTED if low >= ISOTROPIC_FROM else
                   f"{INCONCLUSIVE}: the interval reaches {ISOTROPIC_FROM:g}")
        findings.append(Finding(f"not made isotropic: {evidence.scope(model, task, 'cosreg')}",
                                f"CosReg's last-layer IsoScore* {mean:.3f} [{low:.3f}, {high:.3f}] ({level:.2%} "
                                f"interval, n = {len(own)}; 1 is isotropic)", verdict, ((model, task),)))
    return findings


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
    Claim("istar_beats_base", "I-STAR improves on the baseline (Table 1: best in most cells; each cell's own gain "
          "in the paper is set beside ours)", _istar_beats_base, "no final I-STAR and Base runs"),
    Claim("negative_lambda", "The best λ are negative: decreasing isotropy is what helps (Table 2)",
          _negative_lambdas, "λ | ζ fixed in advance (final.istar): no search chose a sign"),
    Claim("decreasing_isotropy_helps", "Decreasing the isotropy of the representations improves performance: "
          "a trend across λ (Fig. 3, §5–6)", _decreasing_isotropy_helps,
          "no λ sweep and no measured I-STAR runs with λ < 0 beside Base"),
    Claim("istar_lowers_isoscore", "I-STAR with λ < 0 lowers the IsoScore* of the fine-tuned model (Fig. 6)",
          _istar_lowers_isoscore, "no measured final I-STAR runs with λ < 0"),
    Claim("cosreg_not_isotropic", "CosReg lowers the average cosine similarity without making the space "
          "isotropic (Fig. 4)", _cosreg_not_isotropic, "no measured final CosReg runs"),
    Claim("stable_on_mini_batches", "IsoScore* of a mini-batch is close to the point cloud's while IsoScore "
          "underestimates it (Fig. 2)", _stable_on_mini_batches, "the Fig. 2 simulation is off (studies.stability)"),
)
"""The claims, in the order of the table."""


def claims_table(runs: pd.DataFrame, selection: pd.DataFrame | None = None,
                 stability: pd.DataFrame | None = None, config: dict | None = None) -> Table:
    """The claims table: per claim of :data:`CLAIMS`, each finding's scope, numbers and verdict.

    Parameters
    ----------
    runs, selection : ``runs.csv`` and ``selection.csv`` of ``istar aggregate`` (selection may be None).
    stability : ``fig2_stability.csv`` of ``istar stability``, or None.
    config : the resolved config (``results/config.yaml``): the declared primary endpoint, the paper
        models and the training rows of the scopes; None: none declared, the default paper models.

    Returns
    -------
    Table with rows claim × finding (a claim without evidence gets one "not tested" row; the claim
    judged on the declared primary endpoint first, the others in the order of :data:`CLAIMS`) and the
    columns ``Cells``, ``Numbers``, ``Verdict``.
    """
    evidence = Evidence(runs, selection, stability, config)
    judged = [(claim, claim.judge(evidence) or [Finding("–", claim.untested, NOT_TESTED)]) for claim in CLAIMS]
    judged.sort(key=lambda pair: not any(finding.scope.endswith(PRIMARY) for finding in pair[1]))  # it opens the table
    rows = [(claim.statement, finding) for claim, findings in judged for finding in findings]
    tests = evidence.tests
    primary, plan, m = tests.primary, tests.plan, tests.family_size
    declared = (f"The declared primary endpoint (inference.primary): {primary['contrast']} on {primary['model']} "
                f"{get_task(primary['task']).display}; a claim about it is judged on that cell alone."
                if primary else "No primary endpoint declared (inference.primary): claims across cells are judged "
                                "on the pooled estimate.")
    primary_level, secondary_level = verdict_levels(plan.gates, m)
    return Table(
        name="claims",
        caption="The paper's claims and what this study's numbers say about each, at its power.",
        index_names=["Claim"],
        index=[[statement] for statement, _ in rows],
        columns=["Cells", "Numbers", "Verdict"],
        cells=[[finding.scope, finding.numbers, finding.verdict] for _, finding in rows],
        footnotes=[
            f"Multiplicity (inference.multiplicity): {plan.key}, {plan.wording}; the primary "
            f"tested at {primary_level:.4f}, each secondary at {secondary_level:.4f} at worst, over the study's "
            f"{m} confirmatory tests (paired.csv, trend.csv; each row's p_holm and level, the same values as in the "
            f"tables). Tests at α = {ALPHA:g}, two-sided, paired by seed; every interval at 95 % and, where the "
            "plan tests the verdict at a stricter level, beside it at Holm's first-step level; supported / contradicted: significant "
            "in / against the claimed direction after the adjustment; inconclusive: not significant, with the "
            f"smallest effect the comparison detects with {POWER:.0%} power at its verdict's level (below it, a real "
            "effect can hide); not informative: no variation to test; not tested: no runs here bear on it. Beside "
            "each t-test, the Wilcoxon signed-rank test (on the score's grid, ties kept), adjusted the same way, and "
            "the seeds above and below 0; a verdict says where the two disagree at α, or where n pairs cannot reach "
            "the verdict's level (the smallest signed-rank p is 2 / 2ⁿ).",
            "Pooled: random-effects mean over the informative cells (points for scores), with the "
            "Hartung–Knapp–Sidik–Jonkman interval below five cells; a single cell is reported by its own paired "
            "test." + (" The trend: the slope of the score on the fine-tuned model's IsoScore* (and on λ) across "
                       "the λ sweep, from a linear mixed model with a random intercept per seed (REML, Wald interval)."
                       if runs["study"].eq("lambda_sweep").any() else ""),
            declared,
            "The paper's own cell: Rudman & Eickhoff (ICLR 2024) Table 1, the gain over Base of the paper model "
            "mapped to ours (inference.paper_models), Welch's interval over its 5 seeds; not distinguishable where the "
            "interval of ours − the paper's holds 0.",
        ],
    )
