"""Activation statistics: a model's representations of a task's evaluation split, per layer.

One pass over the split (no gradients) gathers in memory, for every layer l = 0 (embeddings) … L:

    cls.layer{l}             (n_features, d) float32   the [CLS] (first-token) vectors
    token_mean.layer{l}      (d,) float64              mean of all non-padding tokens
    token_cov.layer{l}       (d, d) float64            their unbiased covariance (streamed)
    token_unit_sum.layer{l}  (d,) float64              Σ x/‖x‖ over them (exact average cosine
                                                       similarity: (‖Σ x̂‖² − N)/(N(N − 1)))
    last_layer_token_mean, last_layer_token_std  (d,)  per-dimension mean and std, last layer

and metadata (model, task, split, number of tokens, …). :mod:`istar.steps.measure` hands them to
the analysis (:func:`istar.steps.analyze.analyze_statistics`).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from istar.core.measurement import IsotropyMetric
from istar.models.hidden_states import hidden_state_pass

__all__ = ["activation_statistics"]


@torch.no_grad()
def activation_statistics(context, split: str, batch_size: int):
    """The tensors of the module docstring for an opened model context (:func:`istar.steps.common.open_model_context`)
    on a prepared split, and what the analysis names them by: metadata {model, task, split, standin: bool,
    num_hidden_states: L + 1, tokens: N}. Returns (tensors, metadata).

    The forward passes run on the accelerator's device in its precision (``accelerator.autocast``);
    statistics are accumulated in float32/float64.
    """
    accelerator = context.accelerator
    features = context.features(split, with_labels=False, for_qa_eval=True)
    metric = IsotropyMetric()  # its per-layer statistics, unit sums and [CLS] vectors (not its report)
    batches = tqdm(context.loader(features, batch_size), desc="activations", leave=False,
                   disable=not accelerator.is_local_main_process)
    for batch in hidden_state_pass(accelerator.prepare(context.model), batches, device=accelerator.device,
                                   autocast=accelerator.autocast):
        metric.update(batch.states, batch.mask)
    if not metric.per_layer:
        raise ValueError(f"the {split} split is empty")
    tensors = {}
    for layer, accumulator in enumerate(metric.per_layer):
        tensors[f"cls.layer{layer}"] = torch.cat(metric.cls[layer]).contiguous()
        tensors[f"token_mean.layer{layer}"] = accumulator.mean
        tensors[f"token_cov.layer{layer}"] = accumulator.covariance()
        tensors[f"token_unit_sum.layer{layer}"] = metric.unit_sums[layer]
    last = metric.per_layer[-1]
    tensors["last_layer_token_mean"] = last.mean.clone()
    tensors["last_layer_token_std"] = torch.diagonal(last.covariance()).sqrt()
    metadata = {"model": str(context.spec.model), "task": context.task.key, "split": split, "standin": context.standin,
                "num_hidden_states": context.model.config.num_hidden_layers + 1, "tokens": features.num_tokens()}
    return tensors, metadata
