"""The analysis: isotropy and intrinsic dimension of one run's representations (``istar measure``).

Inputs are the run's activation statistics, in memory (:mod:`istar.steps.activations`: streaming
statistics of *all* non-padding evaluation tokens per hidden state, the [CLS] vectors), and a Σ_S of
the same model × task (:mod:`istar.steps.shrinkage`, read by :mod:`istar.core.shrinkage`: every hidden
state's training-data statistics): the pretrained model's file, or the fine-tuned model's own, measured
in memory by :mod:`istar.steps.measure` (``analysis.sigma_s_model``, docs/method.md §7). Output (a run's
``analysis`` in the measurement JSON)::

    {"model", "task", "split", "standin", "zeta", "sigma_s": its file, or the model it was measured from, "tokens": N,
     "global": {"layers": [l, ...], "isoscore_star", "isoscore", "rows"},
     "layers": [{"layer": l, "isoscore_star", "isoscore", "twonn_cls", "cosine_similarity",
                 "tokens"}, ... for l = 0 (embeddings) .. L],
     "last_layer": {"mean": [d floats], "std": [d floats]},
     "warnings": [str, ...]}

Definitions (N = non-padding evaluation tokens, the same tokens in every hidden state):

- ``global``: the union of the selected layers' tokens (``rows`` = N · |layers|), whose
  covariance Σ_X is merged exactly from the per-layer (count, mean, covariance); IsoScore*
  uses Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S with Σ_S of the same layer selection, IsoScore is ζ = 0.
- per hidden state l: IsoScore* with that layer's own Σ_S, IsoScore (ζ = 0) of its tokens'
  covariance, TwoNN dimension of its [CLS] vectors (docs/method.md §5; ``null`` with an entry in
  ``warnings`` when it is undefined, e.g. fewer than 3 distinct vectors), and the exact
  average cosine similarity over all pairs of distinct tokens,
  (‖Σ_i x̂_i‖² − N) / (N(N − 1)), x̂ = x/‖x‖.
- ``last_layer``: per-dimension mean and standard deviation of the last layer's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from istar.core.covariance import CovarianceAccumulator
from istar.core.measurement import isotropy_of_statistics
from istar.core.regularizers import LayerSelection
from istar.core.shrinkage import load_layer_statistics

__all__ = ["ShrinkageReference", "analyze_statistics"]


@dataclass(frozen=True)
class ShrinkageReference:
    """The Σ_S an analysis shrinks towards: every hidden state's statistics (index = hidden state),
    their provenance, and how the output names them (a file's path, or the model they came from)."""

    per_layer: list[CovarianceAccumulator]
    provenance: dict
    name: str

    @classmethod
    def read(cls, path) -> "ShrinkageReference":
        """The Σ_S file ``path`` (written by ``istar shrinkage``)."""
        per_layer, provenance = load_layer_statistics(path)
        return cls(per_layer, provenance, str(path))


def analyze_statistics(tensors: dict[str, torch.Tensor], metadata: dict, sigma: ShrinkageReference,
                       zeta: float, twonn_discard: float = 0.1, layers: LayerSelection = "all") -> dict:
    """The analysis of a run's activation statistics.

    Parameters
    ----------
    tensors, metadata : what :func:`istar.steps.activations.activation_statistics` returns.
    sigma : the :class:`ShrinkageReference` of the same model × task: statistics of the same dimension d and
        number of hidden states L + 1 (:func:`istar.steps.measure.check_inputs` refuses any other before a
        model loads).
    zeta : float in [0, 1], the shrinkage weight ζ of IsoScore* (0 = vanilla IsoScore).
    twonn_discard : fraction in [0, 1) of the largest μ = r₂/r₁ left out of the TwoNN fit.
    layers : the hidden states whose union forms the ``global`` point cloud ("all" =
        layers 1..L, "all+embeddings", an index or a list; see
        :data:`istar.core.regularizers.LayerSelection`).

    Returns
    -------
    dict in the format of the module docstring.
    """
    hidden_states, count = metadata["num_hidden_states"], metadata["tokens"]
    # each hidden state's token statistics rebuilt from the tensors (m2 = Σ_X·(N − 1)), so that merging them gives
    # the exact statistics of their union; isotropy_of_statistics refuses N < 2
    eval_layers = [CovarianceAccumulator.from_state_dict({
        "count": count, "mean": tensors[f"token_mean.layer{layer}"],
        "m2": tensors[f"token_cov.layer{layer}"].double() * (count - 1)}) for layer in range(hidden_states)]
    report = isotropy_of_statistics(eval_layers, [tensors[f"token_unit_sum.layer{layer}"] for layer in range(hidden_states)],
                                    [tensors[f"cls.layer{layer}"] for layer in range(hidden_states)], zeta=zeta,
                                    sigma_s=sigma.per_layer, layers=layers, twonn_discard=twonn_discard).to_dict()
    return {
        "model": metadata["model"], "task": metadata["task"], "split": metadata["split"],
        "standin": metadata["standin"], "zeta": report["zeta"], "sigma_s": sigma.name,
        "tokens": count, "global": report["global"], "layers": report["layers"],
        "last_layer": {"mean": tensors["last_layer_token_mean"].double().tolist(),
                       "std": tensors["last_layer_token_std"].double().tolist()},
        "warnings": report["warnings"],
    }

