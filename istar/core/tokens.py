"""Which positions of a padded batch are rows of a penalty, of Σ_S and of the logged IsoScore*.

A batch of B sequences is padded to T positions (its longest sequence); the attention mask
(B, T) marks the real tokens. The reference code of the paper stacks every one of the B·T
positions of the selected hidden states, padding included; this project's default keeps the
real tokens only (docs/method.md §7). The config key ``penalty.tokens`` chooses one of
:data:`TOKEN_SELECTIONS` for the I-STAR and CosReg penalties, Σ_S and the training log.

No torch import here: the workflow and the report layer read this registry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TokenSelection", "TOKEN_SELECTIONS", "TOKEN_SELECTION_NAMES", "get_token_selection"]


@dataclass(frozen=True)
class TokenSelection:
    """Which positions of a padded batch count as rows of X̃ (penalty), of Σ_S and of the logged IsoScore*.

    key : the config value (``penalty.tokens``).
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


TOKEN_SELECTIONS: dict[str, TokenSelection] = {selection.key: selection for selection in (
    TokenSelection("real", "", masked=True, pad_multiple=True, sigma_uses_training_batches=False,
                   label="real tokens", marker="o", description="real tokens only (attention mask 1)"),
    TokenSelection("all_positions", "_allpos", masked=False, pad_multiple=False, sigma_uses_training_batches=True,
                   label="all positions", marker="s", description="every position of the batch padded to its longest "
                                                                  "sequence, padding included (the reference code)"),
)}

TOKEN_SELECTION_NAMES: tuple[str, ...] = tuple(TOKEN_SELECTIONS)
"""The token selections in registry order; the first is the default."""


def get_token_selection(key: str) -> TokenSelection:
    """Look a token selection up, with an error that lists the known ones."""
    try:
        return TOKEN_SELECTIONS[key]
    except KeyError:
        raise ValueError(f"unknown token selection {key!r}; use one of {', '.join(TOKEN_SELECTIONS)}") from None
