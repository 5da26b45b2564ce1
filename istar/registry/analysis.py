"""Whose Σ_S the analysis of a fine-tuned run shrinks towards (``analysis.sigma_s_model``).

    key          Σ_S                                                 read from
    pretrained   the pretrained model's, on the task's training data  resources/shrinkage/…/sigma0.pt (istar shrinkage)
    fine_tuned   the run's fine-tuned model's, the same statistic     measured by the measure job, per run

The authors' analysis takes the fine-tuned model's (I-STAR/analysis.py, ``run_analysis`` calls
``get_ci`` with the fine-tuned model); this project's default is the pretrained model's, one
reference shared by every run (docs/method.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass

from istar.registry import lookup

__all__ = ["SigmaSource", "SIGMA_SOURCES", "get_sigma_source"]


@dataclass(frozen=True)
class SigmaSource:
    """One value of ``analysis.sigma_s_model``.

    key : the value in the config.
    reads_file : the measurement reads the pretrained model's Σ_S file (else it measures each
        run's fine-tuned model over the same training rows).
    """

    key: str
    reads_file: bool


SIGMA_SOURCES: dict[str, SigmaSource] = {s.key: s for s in (
    SigmaSource("pretrained", reads_file=True),
    SigmaSource("fine_tuned", reads_file=False),
)}


def get_sigma_source(key: str) -> SigmaSource:
    return lookup(SIGMA_SOURCES, key, "Σ_S model", "analysis.sigma_s_model")
