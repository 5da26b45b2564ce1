"""What a study does with a fine-tuning run that collapsed (``inference.collapsed_runs``).

A run *collapsed* when its final evaluation does not beat its task's trivial predictor on the
evaluation split (:func:`istar.core.metrics.collapsed`: the best constant class, the constant
mean, an empty answer). Mosbach et al. (2021, "On the Stability of Fine-tuning BERT", §3) count
such runs as failed and discuss the remedies below; Dodge et al. (2020) show how often they occur.

    key      the paired comparison                                    in the tables
    keep     every run, collapsed or not (the default)                the collapsed runs counted per arm
    exclude  a seed on which any arm collapsed leaves that cell,      the runs and seeds it removed, per arm
             every arm's run of it (a pair is dropped whole)
    rerun    refused: see :data:`RERUN_REFUSAL`
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CollapseRule", "COLLAPSE_RULES", "RERUN_REFUSAL", "get_collapse_rule"]

RERUN_REFUSAL = (
    "rerunning a collapsed run with the next unused seed is not supported: a study's seeds are planned from the "
    "config before any run trains (docs/architecture.md), so a seed chosen after the final runs' metrics would need "
    "a Snakemake checkpoint after them and, for every cell, seeds that differ between arms or a rerun of every arm; "
    "declare keep or exclude, or add seeds to final.seeds and exclude")
"""Why ``rerun`` is refused (the config check and :func:`get_collapse_rule` say it)."""


@dataclass(frozen=True)
class CollapseRule:
    """One value of ``inference.collapsed_runs``.

    key : the value in the config.
    excludes : a seed with a collapsed run leaves its cell's paired comparison.
    wording : how a table's footnote names the rule.
    refusal : why the workflow cannot run it (None: it can).
    """

    key: str
    excludes: bool
    wording: str
    refusal: str | None = None


COLLAPSE_RULES: dict[str, CollapseRule] = {r.key: r for r in (
    CollapseRule("keep", excludes=False, wording="kept in every comparison"),
    CollapseRule("exclude", excludes=True,
                 wording="excluded: a seed on which any arm collapsed left its cell, every arm's run of it"),
    CollapseRule("rerun", excludes=False, wording="rerun with the next unused seed", refusal=RERUN_REFUSAL),
)}


def get_collapse_rule(key: str) -> CollapseRule:
    """The rule ``key``; a ValueError names the known rules, or why ``rerun`` cannot run."""
    try:
        rule = COLLAPSE_RULES[key]
    except KeyError:
        raise ValueError(f"unknown rule for collapsed runs {key!r} (inference.collapsed_runs); choose from "
                         f"{', '.join(COLLAPSE_RULES)}") from None
    if rule.refusal:
        raise ValueError(f"inference.collapsed_runs: {key}: {rule.refusal}")
    return rule
