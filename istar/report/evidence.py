"""What the claims table (:mod:`istar.report.claims`) judges on, and what one judgement gives.

:class:`Evidence` holds the study's records and its resolved config, with the study's one family of
tests (:func:`istar.report.comparisons.study_tests`) computed once; :class:`Finding` is one row of the
table: the cells it covers, the numbers and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from istar.registry.methods import SEARCHED_METHOD
from istar.registry.tasks import get_task
from istar.report.comparisons import StudyTests, study_tests

__all__ = ["Evidence", "Finding"]


@dataclass(frozen=True)
class Evidence:
    """What the claims are judged on: ``runs.csv``, ``selection.csv`` (or None), Fig. 2's
    simulation (``fig2_stability.csv``, or None when the study is off) and the resolved config
    (or None: no primary endpoint, the default paper models, the training rows unknown)."""

    runs: pd.DataFrame
    selection: pd.DataFrame | None = None
    stability: pd.DataFrame | None = None
    config: dict | None = None
    tests: StudyTests = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "tests", study_tests(self.runs, (self.config or {}).get("inference")))

    def scope(self, model: str, task: str, method: str | None = None) -> str:
        """``minilm SST-2, 3,000 training rows, 1 epoch, λ | ζ fixed in advance``: what a verdict holds for."""
        cap = (self.config or {}).get("data", {}).get("max_train_samples")
        full = get_task(task).rows[0]
        parts = [f"{model} {get_task(task).display}"]
        if self.config is not None:
            parts.append(f"{cap:,} training rows" if cap and cap < full else f"the full training split ({full:,} rows)")
        final = self.runs[(self.runs["study"] == "final") & (self.runs["model"] == model) & (self.runs["task"] == task)]
        epochs = sorted(set(final["epochs"].dropna().astype(int))) if "epochs" in final else []
        if epochs:
            parts.append(f"{'/'.join(map(str, epochs))} epoch{'s' if epochs != [1] else ''}")
        if method == SEARCHED_METHOD:
            parts.append(f"λ | ζ {self._origin(model, task)}")
        return ", ".join(parts)

    def _origin(self, model: str, task: str) -> str:
        if ((self.config or {}).get("final", {}).get("istar") or {}).get(model, {}).get(task):
            return "fixed in advance"
        selection = self.selection
        chosen = None if selection is None else selection[(selection["model"] == model) & (selection["task"] == task)]
        if chosen is None or chosen.empty:
            return "as configured"
        protocol = str(chosen["protocol"].iloc[0])
        return {"fixed": "fixed in advance", "validation": "searched on the dev set it is scored on (biased upward)"
                }.get(protocol, "searched on held-out training rows")


@dataclass(frozen=True)
class Finding:
    """One row of the table: the cells it covers, the numbers, and the verdict."""

    scope: str
    numbers: str
    verdict: str
    cells: tuple[tuple[str, str], ...] = ()
    """(model, task) of each cell the finding covers (not shown: the paper's cells are matched on it)."""
