"""The shrinkage covariance Σ_S: streaming covariance of a model's token vectors (METHOD.md §3).

Rows are the non-padding token vectors of the selected layers (the same selection as the
I-STAR penalty), from forward passes without gradients over a task's training data, until
at least ``max_rows`` rows (250,000 in the paper) have been seen. Rows are never stacked:
:class:`~istar.isotropy.CovarianceAccumulator` keeps O(d²) float64 sums. Under data
parallelism every process accumulates its shard and the accumulators are merged in rank
order, so all processes hold the identical Σ_S.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import __version__, io
from .encoding import MODEL_INPUTS, EpochShuffleSampler, encode_split, make_loader
from .isotropy import CovarianceAccumulator
from .regularizers import LayerSpec, parse_layer_spec, resolve_layers

__all__ = ["accumulate_shrinkage", "merge_across_processes", "save_shrinkage", "load_shrinkage", "compute_shrinkage_file"]

DEFAULT_ROWS = 250_000


@torch.no_grad()
def accumulate_shrinkage(model, loader, layers: LayerSpec, max_rows: int = DEFAULT_ROWS, accelerator=None,
                         description: str = "Σ_S") -> CovarianceAccumulator:
    """Accumulate Σ_S over a loader's batches until ``max_rows`` rows (all processes together).

    Parameters
    ----------
    model : a Hugging Face model (unwrapped); run in eval mode here, its mode restored after.
    loader : batches with ``input_ids`` and ``attention_mask`` (B, T); targets are ignored.
    layers : the layer selection (see :data:`istar.regularizers.LayerSpec`).
    max_rows : stop once this many rows (tokens × selected layers) were added; fewer if the
        data runs out.
    accelerator : an ``accelerate.Accelerator`` for device, autocast and the merge across
        processes; None runs on the model's device in one process.

    Returns
    -------
    CovarianceAccumulator holding the merged statistics (identical on every process).
    """
    processes = accelerator.num_processes if accelerator is not None else 1
    target = math.ceil(max_rows / processes)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    accumulator = None
    show = accelerator is None or accelerator.is_local_main_process
    with tqdm(total=target, unit="rows", unit_scale=True, desc=description, disable=not show, leave=False) as bar:
        for batch in loader:
            inputs = {k: v.to(device) for k, v in batch.items() if k in MODEL_INPUTS}
            if accelerator is not None:
                with accelerator.autocast():
                    outputs = model(**inputs, output_hidden_states=True)
            else:
                outputs = model(**inputs, output_hidden_states=True)
            indices = resolve_layers(layers, len(outputs.hidden_states))
            stacked = torch.stack([outputs.hidden_states[i] for i in indices])
            mask = inputs["attention_mask"].bool().expand(len(indices), -1, -1)
            if accumulator is None:
                accumulator = CovarianceAccumulator(stacked.shape[-1], device=device)
            before = accumulator.count
            accumulator.add(stacked, mask=mask)
            bar.update(min(accumulator.count, target) - min(before, target))
            if accumulator.count >= target:
                break
    model.train(was_training)
    if accumulator is None:
        raise ValueError("the data loader yielded no batches: cannot estimate Σ_S")
    if processes > 1:
        accumulator = merge_across_processes(accumulator, accelerator)
    return accumulator


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


def save_shrinkage(path, accumulator: CovarianceAccumulator, provenance: dict) -> None:
    """Write Σ_S with its mean, row count and provenance (atomically) to a ``.pt`` file."""
    io.torch_save(path, {
        "sigma": accumulator.covariance().cpu(),
        "mean": accumulator.mean.cpu(),
        "rows": accumulator.count,
        "provenance": {**provenance, "rows": accumulator.count, "istar_version": __version__},
    })


def load_shrinkage(path, expected_layers: list[int] | None = None, expected_dim: int | None = None) -> tuple[torch.Tensor, dict]:
    """Read a Σ_S file; check it was computed for the expected layers and dimension.

    Returns
    -------
    (sigma (d, d) float64, provenance dict)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shrinkage matrix {path} does not exist: compute it with `istar shrinkage` first")
    data = torch.load(path, map_location="cpu", weights_only=True)
    sigma, provenance = data["sigma"].to(torch.float64), data["provenance"]
    if expected_dim is not None and sigma.shape != (expected_dim, expected_dim):
        raise ValueError(f"{path} holds a {tuple(sigma.shape)} Σ_S but the model's hidden size is {expected_dim}")
    if expected_layers is not None and list(provenance.get("layers", [])) != list(expected_layers):
        raise ValueError(
            f"{path} was computed over layers {provenance.get('layers')} but the penalty uses layers "
            f"{expected_layers}: recompute it with the same --layers"
        )
    return sigma, provenance


def compute_shrinkage_file(model_source: str, data_dir, out, layers: LayerSpec = "all", max_rows: int = DEFAULT_ROWS,
                           batch_size: int = 32, max_length: int = 128, doc_stride: int = 128, seed: int = 0,
                           mixed_precision: str = "no") -> dict:
    """The shrinkage-matrix step: Σ_S of a (pretrained or fine-tuned) model on a task's training data.

    The training split is read in a random order fixed by ``seed``; the result and its
    provenance (model, task, rows, layers, …) are written to ``out``. Returns the provenance.
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
    accumulator = accumulate_shrinkage(model, loader, layers, max_rows, accelerator,
                                       description=f"Σ_S {task.key}")
    provenance = {
        "model": model_source, "model_path": resolve_model_source(model_source), "task": task.key, "split": "train",
        "standin": bool(meta.get("standin", False)), "layers": indices, "layer_spec": layers,
        "requested_rows": max_rows, "max_length": max_length, "seed": seed, "num_processes": accelerator.num_processes,
        "seconds": round(time.perf_counter() - start, 2),
    }
    if accelerator.is_main_process:
        save_shrinkage(out, accumulator, provenance)
    accelerator.wait_for_everyone()
    accelerator.print(f"Σ_S of {model_source} on {task.display} train: {accumulator.count:,} rows over layers "
                      f"{indices} from {accelerator.num_processes} process(es) -> {out}")
    if accumulator.count < max_rows:
        accelerator.print(f"note: the training data gave only {accumulator.count:,} of the {max_rows:,} requested rows")
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
