"""The fine-tuning methods: one registry, read by the trainer, the planner, the workflow, figures and tables.

Each method is a task loss plus, optionally, a penalty weighted by λ (docs/method.md §3–4):

- ``base``: the task loss alone; it takes no hyperparameter (λ is not defined for it).
- ``cosreg``: CosReg, λ times the mean pairwise cosine similarity of the last layer's token
  vectors (real tokens, or every padded position: ``shrinkage.tokens``) (docs/method.md §4); λ defaults to 1 (the paper's CosReg, which lowers anisotropy).
- ``istar``: I-STAR, λ·(1 − IsoScore*) of the chosen layers' token vectors with shrinkage ζ
  towards Σ_S (docs/method.md §3); λ has no default and must be given.

The order of :data:`METHODS` is the order in which methods appear in legends and table rows.

:data:`TOKEN_SELECTIONS` is the registry of the methods' ``tokens`` hyperparameter: which
positions of a padded batch are the penalty's rows (real tokens, or every position as the
authors' code does; docs/method.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHODS", "METHOD_NAMES", "METHOD_PATTERN", "HYPERPARAMETERS", "get_method", "TokenSelection",
           "TOKEN_SELECTIONS", "TOKEN_SELECTION_NAMES", "get_token_selection"]

HYPERPARAMETERS = ("lam", "zeta", "layers", "sigma_s", "tokens")
"""Hyperparameters a method may take: λ, shrinkage ζ, the penalised layers, the shrinkage covariance Σ_S,
which positions of the padded batch are the penalty's rows (``shrinkage.tokens``)."""


@dataclass(frozen=True)
class Method:
    """A fine-tuning method.

    key : registry key, e.g. ``"istar"`` (also the first part of a setting's folder name).
    label : the name shown in figures and tables, e.g. ``"I-STAR"``.
    colour : hex colour of the method in figures (a λ sweep shades it, see :mod:`istar.figure_parts`).
    hyperparameters : the subset of :data:`HYPERPARAMETERS` the method takes.
    default_lam : λ when none is given; None where λ must be given or (``base``) is not taken.
    """

    key: str
    label: str
    colour: str
    hyperparameters: tuple[str, ...]
    default_lam: float | None

    def takes(self, name: str) -> bool:
        """Whether the method takes the hyperparameter ``name`` (one of :data:`HYPERPARAMETERS`)."""
        if name not in HYPERPARAMETERS:
            raise ValueError(f"unknown hyperparameter {name!r}; known: {', '.join(HYPERPARAMETERS)}")
        return name in self.hyperparameters


METHODS: dict[str, Method] = {
    method.key: method
    for method in (
        Method("base", "Base", "#7f7f7f", (), None),
        Method("cosreg", "CosReg", "#ff7f0e", ("lam", "tokens"), 1.0),
        Method("istar", "I-STAR", "#1f77b4", HYPERPARAMETERS, None),
    )
}

METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
"""The method keys in registry order: ``("base", "cosreg", "istar")``."""

METHOD_PATTERN = "|".join(METHOD_NAMES)
"""Regular-expression alternation of the method keys (``base|cosreg|istar``), for setting names and wildcards."""


def get_method(key: str) -> Method:
    """Look a method up by key, with an error that lists the known methods."""
    try:
        return METHODS[key]
    except KeyError:
        raise ValueError(f"unknown method {key!r}; known methods: {', '.join(METHODS)}") from None


# ------------------------------------------------------------------- which positions are rows


@dataclass(frozen=True)
class TokenSelection:
    """Which positions of a padded batch count as rows of X̃ (penalty), of Σ_S and of the logged IsoScore*.

    key : the config value (``shrinkage.tokens``).
    suffix : what a setting's folder name gains (``""`` for the default, so existing paths stay).
    masked : True: only positions whose attention mask is 1; False: every position, padding included.
    pad_multiple : whether batches may be padded to a multiple of 8 under fp16/bf16 (a speed-up that
        adds padding). Off where padding is counted: the reference pads to the longest sequence of
        the batch and no further.
    sigma_uses_training_batches : whether Σ_S passes read batches of the training batch size (the
        amount of padding depends on the batch, so Σ_S must see batches like those the penalty sees;
        the reference computes Σ_S over its training loader) rather than the evaluation batch size.
    label : how tables and figures name it (``"real tokens"``).
    marker : its matplotlib marker in figures.
    description : one line for help texts and reports.
    """

    key: str
    suffix: str
    masked: bool
    pad_multiple: bool
    sigma_uses_training_batches: bool
    label: str
    marker: str
    description: str

    def mask(self, attention_mask):
        """(B, T) bool: the positions that are rows under this selection."""
        mask = attention_mask.bool()
        return mask if self.masked else mask.new_ones(mask.shape)


TOKEN_SELECTIONS: dict[str, TokenSelection] = {
    selection.key: selection
    for selection in (
        TokenSelection("real", "", masked=True, pad_multiple=True, sigma_uses_training_batches=False,
                       label="real tokens", marker="o", description="real tokens only (attention mask 1)"),
        TokenSelection("all_positions", "_allpos", masked=False, pad_multiple=False, sigma_uses_training_batches=True,
                       label="all positions", marker="s", description="every position of the batch padded to its longest sequence, padding included "
                                   "(the reference code)"),
    )
}

TOKEN_SELECTION_NAMES: tuple[str, ...] = tuple(TOKEN_SELECTIONS)
"""The token selections in registry order; the first is the default."""


def get_token_selection(key: str) -> TokenSelection:
    """Look a token selection up, with an error that lists the known ones."""
    try:
        return TOKEN_SELECTIONS[key]
    except KeyError:
        raise ValueError(f"unknown token selection {key!r}; use one of {', '.join(TOKEN_SELECTIONS)}") from None
