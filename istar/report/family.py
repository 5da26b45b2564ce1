"""The study's family of confirmatory tests as its config plans it, and what a rank test can reach there.

Pure Python (no NumPy, pandas or SciPy): the config check (:mod:`istar.pipeline.validate`) reads it
while the workflow builds its DAG. :mod:`istar.report.comparisons` builds the family from the runs;
this module says before any run how many tests it will hold (m) and whether the signed-rank test
reported beside each paired t-test can pass at the level the declared multiplicity plan
(``inference.multiplicity``, :data:`MULTIPLICITY_PLANS`) gives it at worst: the exact test of n pairs
never gives a two-sided p below 2 / 2ⁿ (every difference of one sign).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from istar.core.tokens import TOKEN_SELECTIONS
from istar.registry.methods import BASELINE_METHOD

__all__ = ["ALPHA", "MultiplicityPlan", "MULTIPLICITY_PLANS", "verdict_levels", "FAMILY_MEASURES", "TREND_STUDY", "TREND_COVARIATES", "planned_family_size",
           "smallest_signed_rank_p", "signed_rank_pairs_needed", "rank_test_warning"]

ALPHA = 0.05
"""The level of every test the workflow reports (two-sided), for the family as a whole."""


@dataclass(frozen=True)
class MultiplicityPlan:
    """One value of ``inference.multiplicity``: how the m confirmatory tests share :data:`ALPHA`.

    key : the value in the config.
    gates : the declared primary is tested alone at α and opens the gate: the m − 1 secondaries are
        Holm-adjusted among themselves and pass only where it passes (serial gatekeeping); else one
        Holm family of all m.
    wording : how the report names the plan.
    """

    key: str
    gates: bool
    wording: str


MULTIPLICITY_PLANS: dict[str, MultiplicityPlan] = {plan.key: plan for plan in (
    MultiplicityPlan("family", gates=False, wording="one Holm family, the primary among the secondaries"),
    MultiplicityPlan("gatekeeping", gates=True, wording="the primary alone, the secondaries (Holm among them) only "
                                                        "if it passes"),
)}


def verdict_levels(gates: bool, m: int, alpha: float = ALPHA) -> tuple[float, float]:
    """(the primary's level, each secondary's level at worst) for a family of m tests: where the plan
    gates (:attr:`MultiplicityPlan.gates`), α and α / (m − 1), Holm's first step among the secondaries;
    else α / m for both, Holm's first step over the family. A detectable effect is stated at its test's."""
    if gates:
        return alpha, alpha / max(m - 1, 1)
    return alpha / max(m, 1), alpha / max(m, 1)

FAMILY_MEASURES = {"final": ("score", "isoscore_star", "cosine_similarity", "last_layer_isoscore_star"),
                   "padding": ("score", "isoscore_star")}
"""Study → the measures its paired comparisons with Base test (those the runs have values of)."""

TREND_STUDY = "lambda_sweep"
TREND_COVARIATES = ("isoscore_star", "lam")
"""What the λ sweep's score is regressed on: the fine-tuned model's IsoScore* (the paper's claim), and λ."""


def planned_family_size(config: dict) -> int:
    """m, the number of tests the study's family will hold if every planned run is measured.

    Per model × task: the final study's methods other than Base × :data:`FAMILY_MEASURES` ``final``;
    where the padding study runs, its I-STAR variants (one per token selection) × its measures; where
    the λ sweep runs, one trend per :data:`TREND_COVARIATES`. ``config`` is a validated config.
    """
    cells = len(config["models"]) * len(config["tasks"])
    methods = [method for method in config["final"]["methods"] if method != BASELINE_METHOD]
    size = cells * len(methods) * len(FAMILY_MEASURES["final"])
    studies = config["studies"]
    for study, per_cell in (("padding", len(TOKEN_SELECTIONS) * len(FAMILY_MEASURES["padding"])),
                            (TREND_STUDY, len(TREND_COVARIATES))):
        if studies[study]["enabled"]:
            size += (len(studies[study]["models"] or config["models"])
                     * len(studies[study]["tasks"] or config["tasks"]) * per_cell)
    return size


def smallest_signed_rank_p(n: int) -> float:
    """The smallest two-sided p-value the exact signed-rank test of n pairs gives, 2 / 2ⁿ: a test at a
    level at or below it can never reject."""
    return 2.0 / 2.0 ** int(n)


def signed_rank_pairs_needed(level: float) -> int:
    """The fewest pairs whose exact signed-rank test can reject at ``level`` (2 / 2ⁿ < level)."""
    return math.floor(math.log2(2.0 / level)) + 1


def rank_test_warning(config: dict) -> str | None:
    """Where a declared design's final seeds are too few for the signed-rank test to pass at the level the
    multiplicity plan gives a secondary at worst (:func:`verdict_levels`): a sentence naming the seeds,
    the level and the seeds needed. None where it can pass, where one seed leaves nothing to test, or where
    no primary endpoint is declared (``inference.primary``: an exploratory run, whose tests no verdict is
    declared on)."""
    m = planned_family_size(config)
    plan = MULTIPLICITY_PLANS[config["inference"]["multiplicity"]]
    level = verdict_levels(plan.gates, m)[1]
    seeds = min(len(config["final"]["seeds_by_task"].get(task) or config["final"]["seeds"])
                for task in config["tasks"])
    if config["inference"]["primary"] is None or seeds < 2 or smallest_signed_rank_p(seeds) < level:
        return None
    return (f"the signed-rank test beside each paired t-test cannot pass at this declared design's level: with "
            f"{seeds} seeds its smallest two-sided p is {smallest_signed_rank_p(seeds):.4f}, not below {level:.4f} "
            f"(multiplicity: {plan.key}, {plan.wording}; {m} planned tests); its verdict will say so. Give final.seeds at least {signed_rank_pairs_needed(level)} seeds for it to be able to pass")
