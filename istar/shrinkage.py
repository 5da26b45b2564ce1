"""The shrinkage covariance Σ_S: streaming covariance of a model's token vectors (docs/method.md §3).

Rows are the non-padding token vectors of the selected layers (the same selection as the
I-STAR penalty), from forward passes without gradients over a task's training data, until
at least ``max_rows`` rows (250,000 in the paper) have been seen. Rows are never stacked:
:class:`~istar.isotropy.CovarianceAccumulator` keeps O(d²) float64 sums. Under data
parallelism every process accumulates its shard and the accumulators are merged in rank
order, so all processes hold the identical Σ_S.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import __version__, artifacts
from .encoding import MODEL_INPUTS, EpochShuffleSampler, encode_split, make_loader
from .isotropy import CovarianceAccumulator
from .regularizers import LayerSpec, parse_layer_spec, resolve_layers

__all__ = ["accumulate_shrinkage", "merge_layers", "merge_across_processes", "save_shrinkage", "load_shrinkage", "load_layer_statistics", "compute_shrinkage_file"]

DEFAULT_ROWS = 250_000


@torch.no_grad()
def accumulate_shrinkage(model, loader, layers: LayerSpec, max_rows: int = DEFAULT_ROWS, accelerator=None,
                         description: str = "Σ_S") -> list[CovarianceAccumulator]:
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
        ``max_rows`` (see :data:`istar.regularizers.LayerSpec`).
    max_rows : stop once the selected layers hold this many rows, all processes together;
        fewer if the data runs out.
    accelerator : an ``accelerate.Accelerator`` for device, autocast and the merge across
        processes; None runs on the model's device in one process.

    Returns
    -------
    list of L + 1 CovarianceAccumulator, index = hidden state (0 = embeddings); identical
    on every process.
    """
    processes = accelerator.num_processes if accelerator is not None else 1
    target = math.ceil(max_rows / processes)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    per_layer: list[CovarianceAccumulator] = []
    selected: list[int] = []
    show = accelerator is None or accelerator.is_local_main_process
    with tqdm(total=target, unit="rows", unit_scale=True, desc=description, disable=not show, leave=False) as bar:
        for batch in loader:
            inputs = {k: v.to(device) for k, v in batch.items() if k in MODEL_INPUTS}
            if accelerator is not None:
                with accelerator.autocast():
                    hidden_states = model(**inputs, output_hidden_states=True).hidden_states
            else:
                hidden_states = model(**inputs, output_hidden_states=True).hidden_states
            if not per_layer:
                selected = resolve_layers(layers, len(hidden_states))
                per_layer = [CovarianceAccumulator(hidden_states[0].shape[-1], device=device) for _ in hidden_states]
            mask = inputs["attention_mask"].bool()
            for accumulator, hidden in zip(per_layer, hidden_states):
                accumulator.add(hidden, mask=mask)
            rows = sum(per_layer[i].count for i in selected)
            bar.update(min(rows, target) - bar.n)
            if rows >= target:
                break
    model.train(was_training)
    if not per_layer:
        raise ValueError("the data loader yielded no batches: cannot estimate Σ_S")
    if processes > 1:
        per_layer = [merge_across_processes(accumulator, accelerator) for accumulator in per_layer]
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

    The file is safetensors (no pickle; see :func:`istar.artifacts.save_tensors`): tensors
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
    artifacts.save_tensors(path, tensors, {"provenance": json.dumps(provenance, default=str)})


def load_layer_statistics(path) -> tuple[list[CovarianceAccumulator], dict]:
    """Every layer's accumulator (index = hidden state) and the provenance of a Σ_S file.

    A damaged file (unreadable, or tensors that differ from the hash recorded at write time)
    raises :class:`istar.artifacts.DamagedArtifactError` naming it and the rebuild command.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shrinkage matrix {path} does not exist: compute it with `istar shrinkage` first")
    tensors, metadata = artifacts.load_tensors(path)
    needed = ("per_layer.count", "per_layer.mean", "per_layer.m2")
    if "provenance" not in metadata or any(name not in tensors for name in needed):
        raise artifacts.DamagedArtifactError(path, "not a Σ_S file written by `istar shrinkage` (no per-layer "
                                                   "statistics or provenance)")
    per_layer = [CovarianceAccumulator.from_state_dict({"count": int(c), "mean": m, "m2": m2})
                 for c, m, m2 in zip(tensors["per_layer.count"], tensors["per_layer.mean"], tensors["per_layer.m2"])]
    return per_layer, json.loads(metadata["provenance"])


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


def compute_shrinkage_file(model_source: str, data_dir, out, layers: LayerSpec = "all", max_rows: int = DEFAULT_ROWS,
                           batch_size: int = 32, max_length: int = 128, doc_stride: int = 128, seed: int = 0,
                           mixed_precision: str = "no") -> dict:
    """The shrinkage-matrix step: Σ_S of a (pretrained or fine-tuned) model on a task's training data.

    The training split is read in a random order fixed by ``seed``; the result and its
    provenance (model, task, rows, layers, …) are written to ``out``, the provenance also to ``out`` with
    the suffix ``.json``. Returns the provenance.
    """
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    from accelerate.utils import set_seed

    from .data import read_meta, read_split
    from .models import load_model, load_tokenizer, resolve_model_source
    from .tasks import get_task

    accelerator = Accelerator(mixed_precision=mixed_precision)
    set_seed(seed)
    meta = read_meta(data_dir)
    task = get_task(meta["task"])
    tokenizer = load_tokenizer(model_source)
    model = load_model(model_source, task).to(accelerator.device)
    features = encode_split(read_split(data_dir, "train"), task, tokenizer, max_length, doc_stride, with_labels=False)
    loader = make_loader(features, tokenizer, batch_size, sampler=EpochShuffleSampler(len(features), seed))
    loader = prepare_data_loader(loader, accelerator.device, accelerator.num_processes, accelerator.process_index,
                                 put_on_device=True)
    indices = resolve_layers(layers, model.config.num_hidden_layers + 1)
    start = time.perf_counter()
    per_layer = accumulate_shrinkage(model, loader, layers, max_rows, accelerator, description=f"Σ_S {task.key}")
    rows = merge_layers(per_layer, indices).count
    provenance = {
        "model": model_source, "model_path": resolve_model_source(model_source), "task": task.key, "split": "train",
        "standin": bool(meta.get("standin", False)), "layer_spec": layers,
        "requested_rows": max_rows, "max_length": max_length, "seed": seed, "num_processes": accelerator.num_processes,
        "seconds": round(time.perf_counter() - start, 2),
    }
    provenance["num_layers"] = len(per_layer) - 1
    if accelerator.is_main_process:
        save_shrinkage(out, per_layer, indices, provenance)
        artifacts.write_json(Path(out).with_suffix(".json"), {**provenance, "layers": indices, "rows": rows})
    accelerator.wait_for_everyone()
    accelerator.print(f"Σ_S of {model_source} on {task.display} train: {rows:,} rows over layers "
                      f"{indices} from {accelerator.num_processes} process(es) -> {out}")
    if rows < max_rows:
        accelerator.print(f"note: the training data gave only {rows:,} of the {max_rows:,} requested rows")
    return provenance


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF id, local folder or package:NAME/SUBFOLDER")
    parser.add_argument("--data", required=True, help="prepared task folder (train.parquet, meta.json)")
    parser.add_argument("--out", required=True, help="output .pt file")
    parser.add_argument("--layers", default="all", type=parse_layer_spec,
                        help="all (layers 1..L, default), all+embeddings, an index, or a list like 1,3,5")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="token rows to accumulate (default 250,000)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="no")


def run_cli(args) -> int:
    compute_shrinkage_file(args.model, args.data, args.out, layers=args.layers, max_rows=args.rows,
                           batch_size=args.batch_size, max_length=args.max_length, doc_stride=args.doc_stride,
                           seed=args.seed, mixed_precision=args.mixed_precision)
    return 0
