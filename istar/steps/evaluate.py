"""Evaluation of a sequence-classification, regression or extractive-QA model on a split.

Metrics are computed locally (:mod:`istar.core.metrics`): accuracy (and F1 for MRPC/QQP),
Matthews correlation for CoLA, Pearson and Spearman for STS-B, F1 and exact match
(percent) for SQuAD. Under data parallelism predictions are gathered from every process
(``gather_for_metrics`` drops the padding of the last uneven batch).
"""

from __future__ import annotations


import numpy as np
import torch
from tqdm.auto import tqdm

from istar.core import metrics
from istar.data import qa
from istar.data.encoding import MODEL_INPUTS, Features
from istar.registry.tasks import Task

__all__ = ["evaluate_model", "evaluation_report", "print_evaluation"]


@torch.no_grad()
def evaluate_model(model, loader, task: Task, accelerator, features: Features | None = None,
                   columns=None) -> dict[str, float]:
    """Metrics of ``model`` over an (accelerate-prepared) evaluation loader.

    Parameters
    ----------
    model : the (possibly wrapped) model; evaluated in eval mode, its mode restored after.
    loader : batches of :class:`~istar.data.encoding.Features`, in dataset order.
    task : the task, for the head and metric.
    accelerator : an ``accelerate.Accelerator``.
    features, columns : QA only: the evaluation windows (with ``example_ids`` and
        ``offset_mapping``) and the normalised split's columns (ids, contexts, answers); the answers are
        chosen by :func:`istar.data.qa.postprocess_predictions` with its own limits.

    Returns
    -------
    dict of the task's metrics (fractions for accuracy/F1/correlations, percent for SQuAD)
    plus ``eval_loss`` where the head computes one (not for QA evaluation windows), and the trivial
    predictor's score on the same examples with the predictions' spread
    (:func:`istar.core.metrics.trivial_baseline`; QA: ``trivial_score``, the score of empty answers).
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
        answers = qa.postprocess_predictions(list(columns["id"]), list(columns["context"]), windows,
                                             torch.cat(starts).numpy(), torch.cat(ends).numpy())
        references = {i: list(texts) for i, texts in zip(columns["id"], columns["answer_texts"])}
        # the trivial predictor of extractive QA answers nothing
        trivial = metrics.squad_metrics(dict.fromkeys(references, ""), references)[task.metric]
        return {**metrics.squad_metrics(answers, references), "trivial_score": trivial}
    predictions, labels = torch.cat(predictions).numpy(), torch.cat(labels).numpy()
    result = metrics.compute_metrics(task, predictions, labels)
    result["eval_loss"] = float(np.mean(torch.cat(losses).numpy()))
    return {**result, **metrics.trivial_baseline(task, predictions, labels)}


def print_evaluation(accelerator, label: str, result: dict, task: Task) -> None:
    """Print an evaluation (:func:`evaluate_model`'s ``result``) as ``label: metric = value, …`` and, when it
    does not beat the trivial predictor (:func:`istar.core.metrics.collapsed`), a second line saying so."""
    accelerator.print(f"{label}: " + ", ".join(f"{k} = {v:.4f}" for k, v in result.items()))
    if not metrics.collapsed(result, task.metric):
        return
    how = {"classification": lambda: f"it predicts one class for {result['top_label_share']:.0%} of the examples",
           "regression": lambda: f"its predictions' standard deviation is {result['prediction_std']:.3g}",
           "qa": lambda: "it answers no better than an empty answer"}[task.kind]()
    accelerator.print(f"{label}: COLLAPSED: {task.metric} {result[task.metric]:.4f} does not beat the trivial "
                      f"predictor's {result['trivial_score']:.4f} ({how}); the run learned nothing the metric can see")


def evaluation_report(context, split: str, batch_size: int) -> dict:
    """The evaluation of an opened model context (:func:`istar.steps.common.open_model_context`) on a prepared split:
    task, split, model, standin, headline metric, ``metrics`` (see :func:`evaluate_model`) and examples."""
    columns = context.columns(split)
    features = context.features(split, columns=columns, for_qa_eval=True)
    model, loader = context.accelerator.prepare(context.model, context.loader(features, batch_size))
    result = evaluate_model(model, loader, context.task, context.accelerator, features=features, columns=columns)
    print_evaluation(context.accelerator, f"{context.task.display} {split}", result, context.task)
    return {"task": context.task.key, "split": split, "model": context.spec.model, "standin": context.standin,
            "metric": context.task.metric, "metrics": result, "examples": len(next(iter(columns.values())))}

