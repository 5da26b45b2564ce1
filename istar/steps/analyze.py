"""The analysis step: isotropy and intrinsic dimension of one run's representations.

Inputs are the run's activation statistics (:mod:`istar.steps.activations`: streaming statistics of
*all* non-padding evaluation tokens per hidden state, the [CLS] vectors, a token sample), from
an activations file (``istar analyze``) or in memory (:mod:`istar.steps.measure`, the workflow's way),
and a Σ_S of the same model × task (:mod:`istar.steps.shrinkage`, read by :mod:`istar.core.shrinkage`:
every hidden state's training-data statistics): the pretrained model's file, or the fine-tuned
model's own, measured in memory by :mod:`istar.steps.measure` (``analysis.sigma_s_model``,
docs/method.md §7). Output ``analysis.json``::

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

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from istar.config.schema import default_of
from istar.config.specs import spec_from_cli
from istar.core.covariance import CovarianceAccumulator
from istar.core.measurement import isotropy_of_statistics
from istar.core.regularizers import LayerSelection
from istar.core.shrinkage import load_layer_statistics
from istar.io import artifacts

__all__ = ["ShrinkageReference", "analyze_run", "analyze_statistics"]


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


def _layer_accumulators(tensors: dict[str, torch.Tensor], count: int, num_hidden_states: int,
                       source="the activations") -> list[CovarianceAccumulator]:
    """Rebuild each hidden state's token statistics from an activations file's tensors.

    Parameters
    ----------
    tensors : the tensors of an activations file, with ``token_mean.layer{l}`` (d,) and
        ``token_cov.layer{l}`` (d, d) for l = 0 .. ``num_hidden_states`` − 1.
    count : N, the number of tokens behind every layer's statistics (N ≥ 2).
    num_hidden_states : L + 1.
    source : how to name the tensors' origin in error messages.

    Returns
    -------
    list of L + 1 CovarianceAccumulator with ``count = N``, ``mean`` and
    ``m2 = cov · (N − 1)``, so that merging them gives the exact statistics of the union.
    """
    if count < 2:
        raise ValueError(f"{source} summarise {count} token(s); a covariance needs at least 2")
    return [CovarianceAccumulator.from_state_dict({"count": count, "mean": tensors[f"token_mean.layer{layer}"],
                                                   "m2": tensors[f"token_cov.layer{layer}"].double() * (count - 1)})
            for layer in range(num_hidden_states)]


def _checked(tensors: dict[str, torch.Tensor], metadata: dict[str, str], source: str) -> tuple[int, int]:
    """L + 1 and N of activation statistics (:mod:`istar.steps.activations`), after checking they are complete."""
    missing = [key for key in ("model", "task", "split", "num_hidden_states", "tokens") if key not in metadata]
    if missing:
        raise ValueError(f"{source} lacks the metadata {', '.join(missing)}: it was not written by `istar activations`")
    hidden_states, count = int(metadata["num_hidden_states"]), int(metadata["tokens"])
    expected = [f"{kind}.layer{layer}" for layer in range(hidden_states)
                for kind in ("cls", "token_mean", "token_cov", "token_unit_sum")]
    expected += ["last_layer_token_mean", "last_layer_token_std"]
    absent = [key for key in expected if key not in tensors]
    if absent:
        raise ValueError(f"{source} lacks the tensors {', '.join(absent[:5])}{' …' if len(absent) > 5 else ''} "
                         f"for its {hidden_states} hidden states")
    return hidden_states, count


def analyze_run(activations_path, sigma_path, zeta: float, out=None,
                twonn_discard: float = default_of("analysis.twonn_discard"),
                layers: LayerSelection = "all") -> dict:
    """Isotropy and intrinsic dimension of a run's evaluation-split representations.

    Parameters
    ----------
    activations_path : the run's ``activations.safetensors`` (see :mod:`istar.steps.activations`).
    sigma_path : a Σ_S file of the same model × task (``istar shrinkage``).
    zeta, twonn_discard, layers : see :func:`analyze_statistics`.
    out : where to write the result as JSON (atomically); None writes nothing.

    Returns
    -------
    dict in the format of the module docstring (also written to ``out``).
    """
    activations_path = Path(activations_path)
    if not activations_path.is_file():
        raise FileNotFoundError(f"activations file {activations_path} does not exist: run `istar activations` first")
    tensors, metadata = artifacts.load_tensors(activations_path)  # its content hash checked
    result = analyze_statistics(tensors, metadata, sigma_path, zeta, twonn_discard=twonn_discard, layers=layers,
                                source=f"the activations file {activations_path}")
    if out is not None:
        result = artifacts.write_json(out, result, digest=True)
    return result


def analyze_statistics(tensors: dict[str, torch.Tensor], metadata: dict[str, str], sigma, zeta: float,
                       twonn_discard: float = 0.1, layers: LayerSelection = "all", source: str = "the activations") -> dict:
    """The analysis of activation statistics, in memory or read from a file.

    Parameters
    ----------
    tensors, metadata : what :func:`istar.steps.activations.activation_statistics` returns (or
        :func:`istar.io.artifacts.load_tensors` reads).
    sigma : a :class:`ShrinkageReference`, or the path of a Σ_S file (see :mod:`istar.steps.shrinkage`),
        of the same model × task: statistics of the same dimension d and number of hidden states L + 1.
    zeta : float in [0, 1], the shrinkage weight ζ of IsoScore* (0 = vanilla IsoScore).
    twonn_discard : fraction in [0, 1) of the largest μ = r₂/r₁ left out of the TwoNN fit.
    layers : the hidden states whose union forms the ``global`` point cloud ("all" =
        layers 1..L, "all+embeddings", an index or a list; see
        :data:`istar.core.regularizers.LayerSelection`).
    source : how to name the statistics in error messages.

    Returns
    -------
    dict in the format of the module docstring.
    """
    reference = sigma if isinstance(sigma, ShrinkageReference) else ShrinkageReference.read(sigma)
    zeta = float(zeta)
    hidden_states, count = _checked(tensors, metadata, source)
    sigma_layers, provenance = reference.per_layer, reference.provenance
    dim = tensors["token_mean.layer0"].numel()
    if sigma_layers[0].dim != dim or len(sigma_layers) != hidden_states:
        raise ValueError(
            f"the Σ_S {reference.name} ({len(sigma_layers)} hidden states of dimension {sigma_layers[0].dim}) does "
            f"not match {source} ({hidden_states} hidden states of dimension {dim}): use the Σ_S of the same model")
    if provenance.get("task") not in (None, metadata["task"]):
        raise ValueError(f"the Σ_S {reference.name} was computed on task {provenance['task']!r} but {source} "
                         f"is of task {metadata['task']!r}")
    eval_layers = _layer_accumulators(tensors, count, hidden_states, source=source)
    report = isotropy_of_statistics(eval_layers, [tensors[f"token_unit_sum.layer{layer}"] for layer in range(hidden_states)],
                                    [tensors[f"cls.layer{layer}"] for layer in range(hidden_states)], zeta=zeta,
                                    sigma_s=sigma_layers, layers=layers, twonn_discard=twonn_discard).to_dict()
    return {
        "model": metadata["model"], "task": metadata["task"], "split": metadata["split"],
        "standin": bool(json.loads(metadata.get("standin", "false"))), "zeta": zeta, "sigma_s": reference.name,
        "tokens": count, "global": report["global"], "layers": report["layers"],
        "last_layer": {"mean": tensors["last_layer_token_mean"].double().tolist(),
                       "std": tensors["last_layer_token_std"].double().tolist()},
        "warnings": report["warnings"],
    }


def run_cli(args) -> int:
    spec = spec_from_cli(args)
    result = analyze_run(spec.activations, spec.sigma_s, spec.zeta, out=spec.out, twonn_discard=spec.twonn_discard,
                         layers=spec.layers)
    top = result["layers"][-1]
    print(f"{result['model']} on {result['task']} {result['split']} ({result['tokens']:,} tokens): global IsoScore* "
          f"(ζ = {result['zeta']}) {result['global']['isoscore_star']:.4f}, IsoScore {result['global']['isoscore']:.4f}; "
          f"last layer cosine similarity {top['cosine_similarity']:.4f} -> {spec.out}")
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    return 0
