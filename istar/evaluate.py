"""Evaluation of a sequence-classification, regression or extractive-QA model on a split.

Metrics are computed locally (:mod:`istar.metrics`): accuracy (and F1 for MRPC/QQP),
Matthews correlation for CoLA, Pearson and Spearman for STS-B, F1 and exact match
(percent) for SQuAD. Under data parallelism predictions are gathered from every process
(``gather_for_metrics`` drops the padding of the last uneven batch).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from tqdm.auto import tqdm

from . import artifacts, metrics, qa
from .encoding import MODEL_INPUTS, Features, encode_split, make_loader
from .tasks import Task

__all__ = ["evaluate_model", "evaluate_checkpoint"]


@torch.no_grad()
def evaluate_model(model, loader, task: Task, accelerator, features: Features | None = None,
                   frame=None, n_best: int = 20, max_answer_length: int = 30) -> dict[str, float]:
    """Metrics of ``model`` over an (accelerate-prepared) evaluation loader.

    Parameters
    ----------
    model : the (possibly wrapped) model; evaluated in eval mode, its mode restored after.
    loader : batches of :class:`~istar.encoding.Features`, in dataset order.
    task : the task, for the head and metric.
    accelerator : an ``accelerate.Accelerator``.
    features, frame : QA only: the evaluation windows (with ``example_ids`` and
        ``offset_mapping``) and the normalised split (ids, contexts, answers).

    Returns
    -------
    dict of the task's metrics (fractions for accuracy/F1/correlations, percent for SQuAD)
    plus ``eval_loss`` where the head computes one (not for QA evaluation windows).
    """
    was_training = model.training
    model.eval()
    predictions, labels, starts, ends, losses = [], [], [], [], []
    for batch in tqdm(loader, desc=f"eval {task.display}", leave=False, disable=not accelerator.is_local_main_process):
        with accelerator.autocast():
            outputs = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS or k == "labels"})
        if task.kind == "qa":
            start, end = accelerator.gather_for_metrics((outputs.start_logits.float(), outputs.end_logits.float()))
            starts.append(start.cpu())
            ends.append(end.cpu())
            continue
        logits = outputs.logits.float()
        prediction = logits.squeeze(-1) if task.kind == "regression" else logits.argmax(dim=-1)
        prediction, label = accelerator.gather_for_metrics((prediction, batch["labels"]))
        predictions.append(prediction.cpu())
        labels.append(label.cpu())
        losses.append(accelerator.gather_for_metrics(outputs.loss.detach().float().reshape(1).repeat(len(batch["labels"]))).cpu())
    model.train(was_training)
    if task.kind == "qa":
        windows = {"example_id": features.example_ids, "offset_mapping": features.offset_mapping}
        answers = qa.postprocess_predictions(list(frame["id"]), list(frame["context"]), windows,
                                             torch.cat(starts).numpy(), torch.cat(ends).numpy(),
                                             n_best=n_best, max_answer_length=max_answer_length)
        references = {i: list(texts) for i, texts in zip(frame["id"], frame["answer_texts"])}
        return metrics.squad_metrics(answers, references)
    result = metrics.compute_metrics(task.key, torch.cat(predictions).numpy(), torch.cat(labels).numpy())
    result["eval_loss"] = float(np.mean(torch.cat(losses).numpy()))
    return result


def evaluate_checkpoint(model_source: str, data_dir, out=None, split: str = "validation", batch_size: int = 64,
                        max_length: int = 128, doc_stride: int = 128, mixed_precision: str = "no") -> dict:
    """The evaluation step: metrics of a saved model on a prepared split, written as JSON to ``out``."""
    from accelerate import Accelerator

    from .data import read_meta, read_split
    from .models import load_model, load_tokenizer
    from .tasks import get_task

    accelerator = Accelerator(mixed_precision=mixed_precision)
    meta = read_meta(data_dir)
    task = get_task(meta["task"])
    frame = read_split(data_dir, split)
    tokenizer = load_tokenizer(model_source)
    model = load_model(model_source, task)
    features = encode_split(frame, task, tokenizer, max_length, doc_stride, for_qa_eval=task.kind == "qa")
    model, loader = accelerator.prepare(model, make_loader(features, tokenizer, batch_size))
    result = evaluate_model(model, loader, task, accelerator, features=features, frame=frame)
    report = {"task": task.key, "split": split, "model": model_source, "standin": bool(meta.get("standin", False)),
              "metric": task.metric, "metrics": result, "examples": len(frame)}
    if out is not None and accelerator.is_main_process:
        artifacts.write_json(out, report)
    accelerator.print(f"{task.display} {split}: " + ", ".join(f"{k} = {v:.4f}" for k, v in result.items()))
    return report


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved model folder (or HF id / package:…)")
    parser.add_argument("--data", required=True, help="prepared task folder")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--split", default="validation", choices=["train", "validation"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="no")


def run_cli(args) -> int:
    evaluate_checkpoint(args.model, args.data, args.out, split=args.split, batch_size=args.batch_size,
                        max_length=args.max_length, doc_stride=args.doc_stride, mixed_precision=args.mixed_precision)
    return 0
