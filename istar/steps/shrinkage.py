"""The shrinkage covariance Σ_S: streaming covariance of a model's token vectors (docs/method.md §3).

Rows are the token vectors of the selected layers at the selected positions (the same
selections as the I-STAR penalty: ``layers``, and ``tokens`` — real tokens, or every position
of the padded batch, :data:`istar.core.tokens.TOKEN_SELECTIONS`), from forward passes without
gradients over a task's training data, until at least ``max_rows`` rows (250,000 in the paper) have been seen. Rows are never stacked:
:class:`~istar.core.isotropy.CovarianceAccumulator` keeps O(d²) float64 sums. Under data
parallelism every process accumulates its shard and the accumulators are merged in rank
order, so all processes hold the identical Σ_S.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from istar import __version__
from istar.config.specs import ShrinkageSpec, add_spec_arguments, spec_from_cli
from istar.core.isotropy import CovarianceAccumulator
from istar.core.regularizers import LayerSpec, resolve_layers
from istar.core.tokens import get_token_selection
from istar.data.encoding import EpochShuffleSampler
from istar.io import artifacts
from istar.models.hidden_states import hidden_state_pass

__all__ = ["NonFiniteStatistics", "accumulate_shrinkage", "check_sigma_fits", "merge_layers", "merge_across_processes", "save_shrinkage", "load_shrinkage", "load_layer_statistics", "compute_shrinkage_file"]


class NonFiniteStatistics(ValueError):
    """The model's hidden states hold NaN or inf, so Σ_S would not be finite."""


@torch.no_grad()
def accumulate_shrinkage(model, loader, layers: LayerSpec, max_rows: int, accelerator=None,
                         description: str = "Σ_S", tokens: str = "real") -> list[CovarianceAccumulator]:
    """Accumulate per-layer token statistics until the selected layers gave ``max_rows`` rows.

    Every hidden state (embeddings and each layer) gets its own accumulator, at no extra
    forward cost; Σ_S of any layer selection is then the merge of those layers'
    accumulators (:func:`merge_layers`), so one pass serves the global penalty, one-layer
    penalties and the layer-wise analysis.

    Parameters
    ----------
    model : a Hugging Face model (unwrapped); run in eval mode here, its mode restored after.
    loader : batches with ``input_ids`` and ``attention_mask`` (B, T); targets are ignored.
    layers : the selection whose rows (tokens × selected layers) are counted against
        ``max_rows`` (see :data:`istar.core.regularizers.LayerSpec`).
    max_rows : stop once the selected layers hold this many rows, all processes together;
        fewer if the data runs out.
    accelerator : an ``accelerate.Accelerator`` for device, autocast and the merge across
        processes; None runs on the model's device in one process.
    tokens : which positions of each (padded) batch are rows (:data:`istar.core.tokens.TOKEN_SELECTIONS`):
        ``real`` the attention-masked tokens, ``all_positions`` all B·T positions.

    Returns
    -------
    list of L + 1 CovarianceAccumulator, index = hidden state (0 = embeddings); identical
    on every process. Hidden states holding NaN or inf raise :class:`NonFiniteStatistics`.
    """
    processes = accelerator.num_processes if accelerator is not None else 1
    target = math.ceil(max_rows / processes)
    device = next(model.parameters()).device
    # Accumulators exist before the first batch: a process whose shard is empty still joins the merge.
    per_layer = [CovarianceAccumulator(model.config.hidden_size, device=device)
                 for _ in range(model.config.num_hidden_layers + 1)]
    selected = resolve_layers(layers, len(per_layer))
    selection = get_token_selection(tokens)
    show = accelerator is None or accelerator.is_local_main_process
    autocast = accelerator.autocast if accelerator is not None else contextlib.nullcontext
    with tqdm(total=target, unit="rows", unit_scale=True, desc=description, disable=not show, leave=False) as bar:
        for batch in hidden_state_pass(model, loader, device=device, autocast=autocast):
            for index, (accumulator, hidden) in enumerate(zip(per_layer, batch.states)):
                try:
                    accumulator.add(hidden, mask=selection.mask(batch.mask))
                except ValueError:
                    raise NonFiniteStatistics(f"hidden state {index} of the model holds NaN or inf (a diverged or "
                                              "damaged model, or fp16 overflow)") from None
            rows = sum(per_layer[i].count for i in selected)
            bar.update(min(rows, target) - bar.n)
            if rows >= target:
                break
    if processes > 1:
        per_layer = [merge_across_processes(accumulator, accelerator) for accumulator in per_layer]
    if per_layer[0].count == 0:
        raise ValueError("the data loader yielded no batches: cannot estimate Σ_S")
    return per_layer


def merge_layers(per_layer: list[CovarianceAccumulator], indices: list[int]) -> CovarianceAccumulator:
    """The statistics of the union of the rows of the given layers."""
    merged = CovarianceAccumulator(per_layer[0].dim)
    for index in indices:
        merged.merge(per_layer[index])
    return merged


def merge_across_processes(accumulator: CovarianceAccumulator, accelerator) -> CovarianceAccumulator:
    """Merge every process's accumulator, in rank order, into the same result on every process."""
    device = accelerator.device
    count = torch.tensor([float(accumulator.count)], dtype=torch.float64, device=device)
    counts = accelerator.gather(count).cpu()
    means = accelerator.gather(accumulator.mean.to(device)[None]).cpu()
    m2s = accelerator.gather(accumulator.m2.to(device)[None]).cpu()
    merged = CovarianceAccumulator(accumulator.dim)
    for count, mean, m2 in zip(counts.tolist(), means, m2s):
        merged.merge(CovarianceAccumulator.from_state_dict({"count": int(count), "mean": mean, "m2": m2}))
    checksums = accelerator.gather(merged.m2.sum().reshape(1).to(device)).cpu()
    if not torch.all(checksums == checksums[0]):
        raise RuntimeError(f"processes disagree on Σ_S after the merge (checksums {checksums.tolist()})")
    return merged


def save_shrinkage(path, per_layer: list[CovarianceAccumulator], layers: list[int], provenance: dict) -> None:
    """Write Σ_S of the layer selection ``layers`` and every layer's statistics (atomically).

    The file is safetensors (no pickle; see :func:`istar.io.artifacts.save_tensors`): tensors
    ``sigma`` (d, d) float64, ``mean`` (d,), ``per_layer.count`` (L+1,) int64,
    ``per_layer.mean`` (L+1, d), ``per_layer.m2`` (L+1, d, d); metadata ``provenance`` (JSON,
    with ``layers`` and ``rows`` of the selection) and ``sha256`` of the tensors.
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
    bad = _non_finite(tensors)
    if bad is not None:
        raise NonFiniteStatistics(f"Σ_S for {path} is not finite (NaN or inf in {bad}); nothing was written")
    artifacts.save_tensors(path, tensors, {"provenance": json.dumps(provenance, default=str)})


def _non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or ±inf, or None."""
    return next((name for name, tensor in tensors.items()
                 if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())), None)


def load_layer_statistics(path) -> tuple[list[CovarianceAccumulator], dict]:
    """Every layer's accumulator (index = hidden state) and the provenance of a Σ_S file.

    A damaged file (unreadable, tensors that differ from the hash recorded at write time, or
    NaN / inf anywhere: :func:`save_shrinkage` never writes those) raises
    :class:`istar.io.artifacts.DamagedArtifactError` naming it and the rebuild command.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shrinkage matrix {path} does not exist: compute it with `istar shrinkage` first")
    tensors, metadata = artifacts.load_tensors(path)
    needed = ("per_layer.count", "per_layer.mean", "per_layer.m2")
    if "provenance" not in metadata or any(name not in tensors for name in needed):
        raise artifacts.DamagedArtifactError(path, "not a Σ_S file written by `istar shrinkage` (no per-layer "
                                                   "statistics or provenance)")
    bad = _non_finite(tensors)
    if bad is not None:
        raise artifacts.DamagedArtifactError(path, f"it holds NaN or inf in {bad}, which `istar shrinkage` never "
                                                   "writes")
    per_layer = [CovarianceAccumulator.from_state_dict({"count": int(c), "mean": m, "m2": m2})
                 for c, m, m2 in zip(tensors["per_layer.count"], tensors["per_layer.mean"], tensors["per_layer.m2"])]
    return per_layer, json.loads(metadata["provenance"])


def check_sigma_fits(path, statistics: tuple[list[CovarianceAccumulator], dict], *, task: str | None = None,
                     data=None, shape: tuple[int, int] | None = None, model=None) -> None:
    """Refuse the Σ_S file ``path`` (its :func:`load_layer_statistics`) when it is of another task than
    ``task`` (that of the prepared folder ``data``) or of another shape than ``shape`` = (d, L + 1) of
    ``model``: a ValueError naming both, raised where a step opens the file, before any forward pass.
    Provenance written before a field existed is not judged on it."""
    per_layer, provenance = statistics
    theirs = provenance.get("task")
    if task is not None and theirs not in (None, task):
        raise ValueError(f"{path} holds Σ_S of task {theirs!r}, but the data {data} is of task {task!r}: give the "
                         f"Σ_S of the pretrained model on {task} (`istar shrinkage` on {data})")
    if shape is not None and (per_layer[0].dim, len(per_layer)) != tuple(shape):
        raise ValueError(f"{path} holds Σ_S of {len(per_layer)} hidden states of dimension {per_layer[0].dim}, but "
                         f"the model {model} has {shape[1]} of dimension {shape[0]}: it is another model's Σ_S; give "
                         "the Σ_S of the same pretrained model")


def load_shrinkage(path, expected_layers: list[int] | None = None, expected_dim: int | None = None) -> tuple[torch.Tensor, dict]:
    """Σ_S of a layer selection from a file written by :func:`save_shrinkage`.

    Parameters
    ----------
    path : the ``.pt`` file.
    expected_layers : hidden-state indices; Σ_S of their union is rebuilt from the per-layer
        statistics (so the file of the global penalty also serves one-layer penalties).
        None: the file's own selection.
    expected_dim : the model's hidden size, checked against the file.

    Returns
    -------
    (sigma (d, d) float64, provenance dict with ``layers`` and ``rows`` of the selection)
    """
    per_layer, provenance = load_layer_statistics(path)
    dim = per_layer[0].dim
    if expected_dim is not None and dim != expected_dim:
        raise ValueError(f"{path} holds statistics of dimension {dim} but the model's hidden size is {expected_dim}")
    layers = list(expected_layers) if expected_layers is not None else list(provenance["layers"])
    if not all(0 <= i < len(per_layer) for i in layers):
        raise ValueError(f"{path} has statistics for hidden states 0..{len(per_layer) - 1}, not for layers {layers}")
    merged = merge_layers(per_layer, layers)
    return merged.covariance(), {**provenance, "layers": layers, "rows": merged.count}


def compute_shrinkage_file(spec: ShrinkageSpec) -> dict:
    """The shrinkage-matrix step: Σ_S of a (pretrained or fine-tuned) model on a task's training data.

    The training split is read in a random order fixed by ``spec.seed``; the result and its
    provenance (model, task, rows, layers, …) are written to ``spec.out``, the provenance also
    to ``spec.out`` with the suffix ``.json``. Returns the provenance.
    """
    from accelerate.data_loader import prepare_data_loader

    from istar.steps.common import open_step

    spec.validate()
    step = open_step(spec, model_seed=spec.seed)
    accelerator, task = step.accelerator, step.task
    model = step.model.to(accelerator.device)
    features = step.features("train", with_labels=False)
    loader = step.loader(features, spec.batch_size, sampler=EpochShuffleSampler(len(features), spec.seed))
    # even_batches=False: accelerate would otherwise repeat rows to even out the shards, and Σ_S
    # would count them twice.
    loader = prepare_data_loader(loader, accelerator.device, accelerator.num_processes, accelerator.process_index,
                                 put_on_device=True, even_batches=False)
    indices = resolve_layers(spec.layers, model.config.num_hidden_layers + 1)
    start = time.perf_counter()
    try:
        per_layer = accumulate_shrinkage(model, loader, spec.layers, spec.rows, accelerator,
                                         description=f"Σ_S {task.key}", tokens=spec.tokens)
    except NonFiniteStatistics as error:
        raise NonFiniteStatistics(f"Σ_S for {spec.out} is not finite: {error}; nothing was written") from None
    rows = merge_layers(per_layer, indices).count
    provenance = {
        "model": step.model_name, "model_path": step.model_path, "task": task.key, "split": "train",
        # a held-out selection split's record (istar.data.holdout): which training rows Σ_S saw
        "data_dir": spec.data_dir, "heldout": step.meta.get("heldout"),
        "standin": step.standin, "layer_spec": spec.layers, "tokens": spec.tokens, "batch_size": spec.batch_size,
        "requested_rows": spec.rows, "max_length": spec.max_length, "seed": spec.seed,
        # the forward passes' precision as it ran (istar.registry.precisions); the sums are float64
        "precision": step.precision.label,
        "num_processes": accelerator.num_processes, "seconds": round(time.perf_counter() - start, 2),
    }
    provenance["num_layers"] = len(per_layer) - 1
    if accelerator.is_main_process:
        save_shrinkage(spec.out, per_layer, indices, provenance)
        artifacts.write_json(Path(spec.out).with_suffix(".json"), {**provenance, "layers": indices, "rows": rows})
    accelerator.wait_for_everyone()
    accelerator.print(f"Σ_S of {step.model_name} on {task.display} train: {rows:,} rows ({spec.tokens}) over layers "
                      f"{indices} from {accelerator.num_processes} process(es) -> {spec.out}")
    if rows < spec.rows:
        accelerator.print(f"note: the training data gave only {rows:,} of the {spec.rows:,} requested rows")
    return provenance


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser, ShrinkageSpec)


def run_cli(args) -> int:
    compute_shrinkage_file(spec_from_cli(args))
    return 0
