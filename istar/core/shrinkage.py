"""Σ_S as statistics: per-hidden-state accumulators, their merges over layers and processes, their file.

Σ_S (docs/method.md §3) is the covariance of a model's token vectors at the selected layers
and positions. It is kept as one :class:`~istar.core.covariance.CovarianceAccumulator` per
hidden state (index 0 = embeddings), so that the Σ_S of any layer selection is the exact
merge of those layers' accumulators (:func:`merge_layers`) and one pass over the data serves
the global penalty, one-layer penalties and the layer-wise analysis. Under data parallelism
every process accumulates its shard and :func:`merge_across_processes` combines them in rank
order, so every process holds the identical Σ_S.

The forward passes that fill the accumulators are in :mod:`istar.models.shrinkage`; the file
layout in :mod:`istar.io.sigma_file`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from istar import __version__
from istar.core.covariance import CovarianceAccumulator
from istar.io.sigma_file import first_non_finite, read_sigma_file, write_sigma_file

__all__ = ["NonFiniteStatistics", "add_hidden_states", "merge_layers", "check_sigma_fits", "check_sigma_settings", "Processes", "current_processes",
           "merge_across_processes", "save_shrinkage", "load_layer_statistics", "load_shrinkage"]


class NonFiniteStatistics(ValueError):
    """The model's hidden states hold NaN or inf, so Σ_S would not be finite."""


def add_hidden_states(per_layer: list[CovarianceAccumulator], hidden_states: Sequence[torch.Tensor],
                      rows: torch.Tensor) -> None:
    """Add one batch: the positions where ``rows`` (B, T) is true, of every hidden state (B, T, d).

    Hidden states holding NaN or inf raise :class:`NonFiniteStatistics` naming the hidden state.
    """
    if len(hidden_states) != len(per_layer):
        raise ValueError(f"the batch has {len(hidden_states)} hidden states but Σ_S is accumulated over "
                         f"{len(per_layer)}: use the same model throughout")
    for index, (accumulator, hidden) in enumerate(zip(per_layer, hidden_states)):
        try:
            accumulator.add(hidden, mask=rows)
        except ValueError as error:
            if "NaN or inf" not in str(error):
                raise
            raise NonFiniteStatistics(f"hidden state {index} of the model holds NaN or inf (a diverged or "
                                      "damaged model, or fp16 overflow)") from None


def merge_layers(per_layer: Sequence[CovarianceAccumulator], indices: Sequence[int]) -> CovarianceAccumulator:
    """The statistics of the union of the rows of the given layers."""
    merged = CovarianceAccumulator(per_layer[0].dim)
    for index in indices:
        merged.merge(per_layer[index])
    return merged


@dataclass(frozen=True)
class Processes:
    """This process's place among the data-parallel processes, and how it gathers from them.

    Attributes
    ----------
    rank, size : this process's index and the number of processes (0 and 1 alone).
    gather : concatenates a tensor from every process along dimension 0, in rank order (as
        ``accelerator.gather``); None in one process.
    device : where gathered tensors travel (None in one process).
    """

    rank: int = 0
    size: int = 1
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    device: torch.device | None = None


def current_processes(accelerator=None) -> Processes:
    """The data-parallel processes of this run.

    An ``accelerate.Accelerator`` gathers through itself; without one, an initialised
    ``torch.distributed`` process group with several ranks gathers with ``all_gather``
    (torchrun, or a Trainer launched by ``accelerate launch``); otherwise there is one process.
    """
    if accelerator is not None:
        if accelerator.num_processes == 1:
            return Processes()
        return Processes(accelerator.process_index, accelerator.num_processes, accelerator.gather, accelerator.device)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return Processes()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    return Processes(dist.get_rank(), dist.get_world_size(), gather, device)


def merge_across_processes(accumulator: CovarianceAccumulator, processes: Processes) -> CovarianceAccumulator:
    """Merge every process's accumulator, in rank order, into the same result on every process
    (:func:`current_processes`); in one process, the accumulator itself."""
    if processes.gather is None:
        return accumulator
    gather, device = processes.gather, processes.device
    counts = gather(torch.tensor([float(accumulator.count)], dtype=torch.float64, device=device)).cpu()
    means = gather(accumulator.mean.to(device)[None]).cpu()
    m2s = gather(accumulator.m2.to(device)[None]).cpu()
    merged = CovarianceAccumulator(accumulator.dim)
    for count, mean, m2 in zip(counts.tolist(), means, m2s):
        merged.merge(CovarianceAccumulator.from_state_dict({"count": int(count), "mean": mean, "m2": m2}))
    checksums = gather(merged.m2.sum().reshape(1).to(device)).cpu()
    if not torch.all(checksums == checksums[0]):
        raise RuntimeError(f"processes disagree on Σ_S after the merge (checksums {checksums.tolist()})")
    return merged


def save_shrinkage(path, per_layer: list[CovarianceAccumulator], layers: list[int], provenance: dict) -> None:
    """Write Σ_S of the layer selection ``layers`` and every layer's statistics (atomically).

    The format is :mod:`istar.io.sigma_file` (safetensors, no pickle). Non-finite statistics
    raise :class:`NonFiniteStatistics` and write nothing.
    """
    selection = merge_layers(per_layer, layers)
    tensors = {
        "sigma": selection.covariance(),
        "mean": selection.mean,
        "per_layer.count": torch.tensor([a.count for a in per_layer], dtype=torch.int64),
        "per_layer.mean": torch.stack([a.mean.cpu() for a in per_layer]),
        "per_layer.m2": torch.stack([a.m2.cpu() for a in per_layer]),
    }
    provenance = {**provenance, "layers": list(layers), "rows": selection.count, "istar_version": __version__}
    if (bad := first_non_finite(tensors)) is not None:
        raise NonFiniteStatistics(f"Σ_S for {path} is not finite (NaN or inf in {bad}); nothing was written")
    write_sigma_file(path, tensors, provenance)


def check_sigma_fits(path, per_layer: Sequence[CovarianceAccumulator], provenance: dict, *, task: str | None = None,
                     data=None, shape: tuple[int, int] | None = None, model=None) -> None:
    """Refuse the Σ_S file ``path`` (its statistics ``per_layer`` and ``provenance``, as
    :func:`load_layer_statistics` returns them) when it is of another task than ``task`` (that of the
    prepared folder ``data``) or of another shape than ``shape`` = (d, L + 1) of ``model``: a
    ValueError naming both, raised where a step opens the file, before any forward pass.
    Provenance written before a field existed is not judged on it."""
    theirs = provenance.get("task")
    if task is not None and theirs not in (None, task):
        raise ValueError(f"{path} holds Σ_S of task {theirs!r}, but the data {data} is of task {task!r}: give the "
                         f"Σ_S of the pretrained model on {task} (`istar shrinkage` on {data})")
    if shape is not None and (per_layer[0].dim, len(per_layer)) != tuple(shape):
        raise ValueError(f"{path} holds Σ_S of {len(per_layer)} hidden states of dimension {per_layer[0].dim}, but "
                         f"the model {model} has {shape[1]} of dimension {shape[0]}: it is another model's Σ_S; give "
                         "the Σ_S of the same pretrained model")


# Where a Σ_S file written before its pass recorded its spec keeps its settings (ShrinkageSpec field ->
# provenance key); the model it names there is its source, not the spec's.
LEGACY_SETTING_KEYS = {"rows": "requested_rows", "layers": "layer_spec", "tokens": "tokens", "batch_size": "batch_size",
                       "max_length": "max_length", "data_dir": "data_dir", "seed": "seed"}


def check_sigma_settings(path, provenance: dict, expected: dict, fix: str) -> None:
    """Refuse the Σ_S file ``path`` when a setting of the pass that made it differs from what the reader
    expects: ``expected`` maps fields of :class:`istar.config.specs.ShrinkageSpec` (``rows``, ``layers``,
    ``tokens``, ``model``) to the reader's values, compared with the spec the file records (or, in a file
    written before specs were recorded, the provenance keys that hold them). A ValueError names the file,
    each differing setting with both values, and ``fix``; raised before any forward pass."""
    recorded = provenance.get("spec") or {name: provenance[key] for name, key in LEGACY_SETTING_KEYS.items()
                                          if key in provenance}
    differ = [f"{name} {recorded[name]!r} where {value!r} is expected" for name, value in expected.items()
              if name in recorded and recorded[name] != value]
    if differ:
        raise ValueError(f"{path} was computed with other settings than its reader's: {'; '.join(differ)}; {fix}")


def load_layer_statistics(path) -> tuple[list[CovarianceAccumulator], dict]:
    """Every layer's accumulator (index = hidden state) and the provenance of a Σ_S file.

    A missing or damaged file raises the errors of :func:`istar.io.sigma_file.read_sigma_file`.
    """
    tensors, provenance = read_sigma_file(path)
    per_layer = [CovarianceAccumulator.from_state_dict({"count": int(c), "mean": m, "m2": m2})
                 for c, m, m2 in zip(tensors["per_layer.count"], tensors["per_layer.mean"], tensors["per_layer.m2"])]
    return per_layer, provenance


def load_shrinkage(path, expected_layers: list[int] | None = None) -> tuple[torch.Tensor, dict]:
    """Σ_S of a layer selection from a file written by :func:`save_shrinkage`.

    Parameters
    ----------
    path : the ``.pt`` file.
    expected_layers : hidden-state indices; Σ_S of their union is rebuilt from the per-layer
        statistics (so the file of the global penalty also serves one-layer penalties).
        None: the file's own selection.

    Returns
    -------
    (sigma (d, d) float64, provenance dict with ``layers`` and ``rows`` of the selection)
    """
    per_layer, provenance = load_layer_statistics(path)
    layers = list(expected_layers) if expected_layers is not None else list(provenance["layers"])
    if not all(0 <= i < len(per_layer) for i in layers):
        raise ValueError(f"{path} has statistics for hidden states 0..{len(per_layer) - 1}, not for layers {layers}")
    merged = merge_layers(per_layer, layers)
    return merged.covariance(), {**provenance, "layers": layers, "rows": merged.count}
