"""The fine-tuning methods: one registry, read by the trainer, the planner, the workflow, figures and tables.

Each method is a task loss plus, optionally, a penalty weighted by λ (docs/method.md §3–4):

- ``base``: the task loss alone; it takes no hyperparameter (λ is not defined for it).
- ``cosreg``: CosReg, λ times the mean pairwise cosine similarity of the last layer's token
  vectors (real tokens, or every padded position: ``penalty.tokens``; docs/method.md §4); λ
  defaults to 1 (the paper's CosReg, which lowers anisotropy).
- ``istar``: I-STAR, λ·(1 − IsoScore*) of the chosen layers' token vectors with shrinkage ζ
  towards Σ_S (docs/method.md §3); λ has no default and must be given.

The order of :data:`METHODS` is the order in which methods appear in legends and table rows.
An entry carries the method's behaviour too: its penalty, the hyperparameters it takes (and so
whether it reads Σ_S) and the layers it penalises. The trainer, the specs, the planner and the
aggregation ask the entry; none of them names a method. Adding a method (a whitening or an
all-but-the-top baseline, say) is a penalty in :mod:`istar.core.regularizers` and an entry here.

:data:`istar.core.tokens.TOKEN_SELECTIONS` is the registry of the ``tokens`` hyperparameter:
which positions of a padded batch are the penalty's rows (real tokens, or every position as
the authors' code does; docs/method.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass

from istar.registry import lookup

__all__ = ["Method", "METHODS", "METHOD_NAMES", "METHOD_PATTERN", "BASELINE_METHOD", "SEARCHED_METHOD", "HYPERPARAMETERS",
           "get_method"]

HYPERPARAMETERS = ("lam", "zeta", "layers", "sigma_s", "tokens")
"""Hyperparameters a method may take: λ, shrinkage ζ, the penalised layers, the shrinkage covariance Σ_S,
which positions of the padded batch are the penalty's rows (``penalty.tokens``)."""


@dataclass(frozen=True)
class Method:
    """A fine-tuning method.

    key : registry key, e.g. ``"istar"`` (also the first part of a setting's folder name).
    label : the name shown in figures and tables, e.g. ``"I-STAR"``.
    colour : hex colour of the method in figures (a λ sweep shades it, see :mod:`istar.report.figure_parts`).
    hyperparameters : the subset of :data:`HYPERPARAMETERS` the method takes.
    default_lam_key : the config key whose schema default is λ when none is given (CosReg:
        ``final.cosreg_lambda``, so the command line and the workflow share one value); None where λ
        must be given or (``base``) is not taken.
    penalty : the name of the method's penalty in :mod:`istar.core.regularizers`, called as
        ``penalty(hidden_states, attention_mask, **hyperparameters)`` with the hyperparameters the method
        takes and returning a :class:`istar.core.regularizers.Penalty`, the term added to the task loss; None
        for a method that adds none (then the model is run without ``output_hidden_states``).
    global_penalty : the name of its variant on the union of every data-parallel process's batch
        (``penalty.global_penalty``), None where the method has none.
    fixed_layers : the hidden states the penalty reads when the method takes no ``layers`` (CosReg
        and the baseline: ``-1``, the last layer); None for a method that takes ``layers``. (The
        Σ_S every run measures after each epoch is over the spec's ``layers`` whatever the method:
        :mod:`istar.steps.sigma_tracking`.)
    searched : whether the search tunes this method's λ and ζ (I-STAR): ``best.json`` names its choice, a
        fixed λ | ζ (``final.istar``) stands in for that choice, and the claims are about it.
    """

    key: str
    label: str
    colour: str
    hyperparameters: tuple[str, ...]
    default_lam_key: str | None
    penalty: str | None = None
    global_penalty: str | None = None
    fixed_layers: int | None = None
    searched: bool = False

    def takes(self, name: str) -> bool:
        """Whether the method takes the hyperparameter ``name`` (one of :data:`HYPERPARAMETERS`)."""
        if name not in HYPERPARAMETERS:
            raise ValueError(f"unknown hyperparameter {name!r}; known: {', '.join(HYPERPARAMETERS)}")
        return name in self.hyperparameters

    def needs_sigma_s(self, zeta: float) -> bool:
        """Whether a run with shrinkage weight ``zeta`` reads a Σ_S file (it shrinks towards it when ζ > 0)."""
        return self.takes("sigma_s") and zeta > 0

    @property
    def penalises(self) -> bool:
        """Whether the method adds a term to the task loss (the baseline adds none)."""
        return self.penalty is not None

    def penalty_layers(self, layers):
        """The hidden states the penalty reads, given the configured ``layers`` selection."""
        return layers if self.takes("layers") else self.fixed_layers

    def penalise(self, hidden_states, attention_mask, *, global_batch: bool, **values):
        """The method's term for one batch (:class:`istar.core.regularizers.Penalty`): its penalty (the global
        variant under ``global_batch`` where it has one) called with the ``values`` of the hyperparameters it
        takes (``lam``, ``zeta``, ``sigma_s``, ``layers``, ``tokens``); None for a method that adds none (the
        baseline). The one place both the ``train`` step and the integrations turn a method into its penalty."""
        if not self.penalises:
            return None
        # imported here, not with the registry: the workflow reads the registry while it builds the DAG,
        # and torch would add seconds to that
        from istar.core import regularizers

        penalty = getattr(regularizers, self.global_penalty if global_batch and self.global_penalty else self.penalty)
        return penalty(hidden_states, attention_mask, **{name: values[name] for name in self.hyperparameters})


METHODS: dict[str, Method] = {
    method.key: method
    for method in (
        Method("base", "Base", "#7f7f7f", (), None, fixed_layers=-1),
        Method("cosreg", "CosReg", "#ff7f0e", ("lam", "tokens"), "final.cosreg_lambda", penalty="cosreg_penalty",
               fixed_layers=-1),
        Method("istar", "I-STAR", "#1f77b4", HYPERPARAMETERS, None, penalty="istar_penalty",
               global_penalty="global_istar_penalty", searched=True),
    )
}

METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
"""The method keys in registry order: ``("base", "cosreg", "istar")``."""

METHOD_PATTERN = "|".join(METHOD_NAMES)
"""Regular-expression alternation of the method keys (``base|cosreg|istar``), for setting names and wildcards."""


BASELINE_METHOD: str = next(key for key, method in METHODS.items() if not method.penalises)
"""The method every other one is compared with, seed by seed: the one that adds no penalty (``base``)."""

SEARCHED_METHOD: str = next(key for key, method in METHODS.items() if method.searched)
"""The method whose λ and ζ the search tunes (``istar``); where λ = 0 is in its grid, Base is one of its candidates."""


def get_method(key: str) -> Method:
    """Look a method up by key, with an error that lists the known methods."""
    return lookup(METHODS, key, "method")

