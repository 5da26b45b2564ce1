"""What a study does with a fine-tuning run that collapsed (``inference.collapsed_runs``).

A run *collapsed* when its final evaluation does not beat its task's trivial predictor on the
evaluation split (:func:`istar.core.metrics.collapsed`: the best constant class, the constant
mean, an empty answer). Mosbach et al. (2021, "On the Stability of Fine-tuning BERT", §3) count
such runs as failed and discuss the remedies below; Dodge et al. (2020) show how often they occur.

    key      the paired comparison                                    in the tables
    keep     every run, collapsed or not (the default)                the collapsed runs counted per arm
    exclude  a seed on which any arm collapsed leaves that cell,      the runs and seeds it removed, per arm
             every arm's run of it (a pair is dropped whole)
    rerun    as exclude, and the final stage trains every arm of a    the same counts; the replacements
             cell again, once, on the next unused seed for each such  are the final runs' added seeds
             seed (results/collapse/{model}/{task}.json, a workflow
             checkpoint after the final runs); a replacement that
             collapses too is excluded and counted
"""

from __future__ import annotations

from dataclasses import dataclass

from istar.registry import lookup

__all__ = ["CollapseRule", "COLLAPSE_RULES", "get_collapse_rule"]

@dataclass(frozen=True)
class CollapseRule:
    """One value of ``inference.collapsed_runs``.

    key : the value in the config.
    excludes : a seed with a collapsed run leaves its cell's paired comparison.
    wording : how a table's footnote names the rule.
    replaces : the final stage trains a collapsed seed's pair again on the next unused seed.
    """

    key: str
    excludes: bool
    wording: str
    replaces: bool = False


COLLAPSE_RULES: dict[str, CollapseRule] = {r.key: r for r in (
    CollapseRule("keep", excludes=False, wording="kept in every comparison"),
    CollapseRule("exclude", excludes=True,
                 wording="excluded: a seed on which any arm collapsed left its cell, every arm's run of it"),
    CollapseRule("rerun", excludes=True, replaces=True,
                 wording="a seed on which any arm of a final cell collapsed left it, every arm's run of it, "
                         "and every arm trained once more on the next unused seed (a replacement that collapsed "
                         "too is excluded; other studies' collapsed seeds are excluded)"),
)}


def get_collapse_rule(key: str) -> CollapseRule:
    """The rule ``key``; a ValueError names the known rules."""
    return lookup(COLLAPSE_RULES, key, "collapse rule", "inference.collapsed_runs")
