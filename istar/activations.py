"""The activations step: a model's representations of a task's evaluation split, per layer.

One pass over the split (no gradients) writes a ``safetensors`` file with, for every layer
l = 0 (embeddings) … L:

    cls.layer{l}             (n_features, d) float32   the [CLS] (first-token) vectors
    tokens.layer{l}          (k, d) float32            a random sample of k non-padding token
                                                       vectors, the same tokens in every layer
    token_mean.layer{l}      (d,) float64              mean of all non-padding tokens
    token_cov.layer{l}       (d, d) float64            their unbiased covariance (streamed)
    token_unit_sum.layer{l}  (d,) float64              Σ x/‖x‖ over them (exact average cosine
                                                       similarity: (‖Σ x̂‖² − N)/(N(N − 1)))
    last_layer_token_mean, last_layer_token_std  (d,)  per-dimension mean and std, last layer

and string metadata (model, task, split, number of tokens, …). The analysis step reads it.
"""

from __future__ import annotations

import argparse
import json

import torch
from tqdm.auto import tqdm

from . import __version__, artifacts
from .encoding import MODEL_INPUTS, encode_split, make_loader
from .isotropy import CovarianceAccumulator

__all__ = ["extract_activations", "load_activations"]

DEFAULT_TOKEN_SAMPLE = 2048


@torch.no_grad()
def collect(model, loader, num_tokens: int, sample_size: int, seed: int, device,
            autocast_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Run ``model`` over ``loader`` and gather the tensors listed in the module docstring.

    ``num_tokens`` is the number of non-padding tokens the loader holds; ``sample_size`` of
    them (chosen with ``seed``) are kept in full. ``autocast_dtype`` runs the forward passes
    under autocast (statistics are still accumulated in float32/float64).
    """
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(num_tokens, generator=generator)[:min(sample_size, num_tokens)].sort().values
    cls, sampled, accumulators, unit_sums = [], [], [], []
    seen = 0
    model.eval()
    for batch in tqdm(loader, desc="activations", leave=False):
        inputs = {k: v.to(device) for k, v in batch.items() if k in MODEL_INPUTS}
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            hidden = torch.stack(model(**inputs, output_hidden_states=True).hidden_states).float()  # (L+1, B, T, d)
        mask = inputs["attention_mask"].bool()
        tokens = hidden[:, mask]  # (L+1, M, d) in reading order
        if not accumulators:
            accumulators = [CovarianceAccumulator(hidden.shape[-1]) for _ in range(hidden.shape[0])]
            unit_sums = [torch.zeros(hidden.shape[-1], dtype=torch.float64) for _ in range(hidden.shape[0])]
        ordinals = torch.arange(seen, seen + tokens.shape[1])
        keep = torch.isin(ordinals, chosen)
        seen += tokens.shape[1]
        cls.append(hidden[:, :, 0].cpu())
        sampled.append(tokens[:, keep.to(tokens.device)].cpu())
        for layer, rows in enumerate(tokens):
            accumulators[layer].add(rows.cpu())
            unit_sums[layer] += torch.nn.functional.normalize(rows.double(), dim=1).sum(dim=0).cpu()
    if not accumulators:
        raise ValueError("the evaluation split is empty")
    cls_all, sampled_all = torch.cat(cls, dim=1), torch.cat(sampled, dim=1)
    tensors = {}
    for layer, accumulator in enumerate(accumulators):
        tensors[f"cls.layer{layer}"] = cls_all[layer].contiguous()
        tensors[f"tokens.layer{layer}"] = sampled_all[layer].contiguous()
        tensors[f"token_mean.layer{layer}"] = accumulator.mean
        tensors[f"token_cov.layer{layer}"] = accumulator.covariance()
        tensors[f"token_unit_sum.layer{layer}"] = unit_sums[layer]
    last = accumulators[-1]
    tensors["last_layer_token_mean"] = last.mean.clone()
    tensors["last_layer_token_std"] = torch.diagonal(last.covariance()).sqrt()
    return tensors


def extract_activations(model_source: str, data_dir, out, split: str = "validation", batch_size: int = 64,
                        max_length: int = 128, doc_stride: int = 128, token_sample: int = DEFAULT_TOKEN_SAMPLE,
                        seed: int = 0, mixed_precision: str = "no") -> dict:
    """The activations step: see the module docstring. Returns the file's metadata."""
    from .data import read_meta, read_split
    from .models import load_model, load_tokenizer
    from .tasks import get_task

    meta = read_meta(data_dir)
    task = get_task(meta["task"])
    frame = read_split(data_dir, split)
    tokenizer = load_tokenizer(model_source)
    model = load_model(model_source, task)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    features = encode_split(frame, task, tokenizer, max_length, doc_stride, with_labels=False,
                            for_qa_eval=task.kind == "qa")
    num_tokens = features.num_tokens()
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mixed_precision) if device.type == "cuda" else None
    tensors = collect(model, make_loader(features, tokenizer, batch_size), num_tokens, token_sample, seed, device,
                      autocast_dtype)
    metadata = {
        "model": str(model_source), "task": task.key, "split": split, "num_hidden_states": str(model.config.num_hidden_layers + 1),
        "features": str(len(features)), "tokens": str(num_tokens), "token_sample": str(tensors["tokens.layer0"].shape[0]),
        "max_length": str(max_length), "seed": str(seed), "standin": json.dumps(bool(meta.get("standin", False))),
        "istar_version": __version__,
    }
    artifacts.save_tensors(out, tensors, metadata)
    print(f"activations of {model_source} on {task.display} {split}: {len(features):,} features, {num_tokens:,} tokens, "
          f"{model.config.num_hidden_layers + 1} hidden states -> {out}")
    return metadata


def load_activations(path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read an activations file: (tensors, metadata), its content hash checked
    (:class:`istar.artifacts.DamagedArtifactError` names a damaged file)."""
    return artifacts.load_tensors(path)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved model folder, HF id or package:NAME/SUBFOLDER")
    parser.add_argument("--data", required=True, help="prepared task folder")
    parser.add_argument("--out", required=True, help="output .safetensors file")
    parser.add_argument("--split", default="validation", choices=["train", "validation"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--token-sample", type=int, default=DEFAULT_TOKEN_SAMPLE,
                        help="non-padding token vectors kept per layer (same tokens in every layer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="no",
                        help="autocast the forward passes on a GPU (default: fp32)")


def run_cli(args) -> int:
    extract_activations(args.model, args.data, args.out, split=args.split, batch_size=args.batch_size,
                        max_length=args.max_length, doc_stride=args.doc_stride, token_sample=args.token_sample,
                        seed=args.seed, mixed_precision=args.mixed_precision)
    return 0
