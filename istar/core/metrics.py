"""Task metrics, computed locally (the hub's metric scripts cannot be loaded offline).

Units
-----
- Classification metrics are fractions: ``accuracy`` and ``f1`` in [0, 1] (0.853, not 85.3);
  ``matthews`` in [-1, 1].
- Regression metrics (STS-B) are correlation coefficients in [-1, 1].
- SQuAD metrics (:func:`squad_metrics`) are percentages in [0, 100], as SQuAD reports them.

Undefined values
----------------
Matthews, Pearson and Spearman divide by a standard deviation; when the prediction or the
label vector is constant that deviation is zero and the coefficient is undefined.  They
return 0.0 in that case (no association can be measured), so model selection never meets a
NaN.  Binary F1 is 0.0 when neither predictions nor labels contain the positive class.

Every function raises ``ValueError`` for empty inputs and for predictions and labels of
different lengths.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["accuracy", "f1_binary", "matthews_corrcoef", "pearson", "spearman", "normalize_answer", "exact_match_score",
           "f1_score", "squad_metrics", "compute_metrics", "trivial_baseline", "collapsed", "COLLAPSE_TOLERANCE"]


# --------------------------------------------------------------------------------------
# classification and regression
# --------------------------------------------------------------------------------------


def _as_pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    """Return predictions and labels as 1-D arrays of the same, non-zero length."""
    predictions = np.asarray(predictions)
    labels = np.asarray(labels)
    if predictions.ndim != 1 or labels.ndim != 1:
        raise ValueError(f"predictions and labels must be 1-D of shape (n,); got shapes {predictions.shape} and "
                         f"{labels.shape}")
    if len(predictions) != len(labels):
        raise ValueError(f"got {len(predictions)} predictions but {len(labels)} labels")
    if len(predictions) == 0:
        raise ValueError("predictions and labels are empty")
    return predictions, labels


def accuracy(predictions, labels) -> float:
    """Fraction of predictions equal to their label.

    Parameters
    ----------
    predictions, labels : array-like of shape (n,)
        Class ids.

    Returns
    -------
    float in [0, 1].
    """
    predictions, labels = _as_pair(predictions, labels)
    return float(np.mean(predictions == labels))


def f1_binary(predictions, labels) -> float:
    """F1 score of the positive class 1: ``2·TP / (2·TP + FP + FN)``.

    Parameters
    ----------
    predictions, labels : array-like of shape (n,)
        Class ids; 1 is the positive class, every other id is negative.

    Returns
    -------
    float in [0, 1]; 0.0 when neither predictions nor labels contain a 1.
    """
    predictions, labels = _as_pair(predictions, labels)
    predicted, actual = predictions == 1, labels == 1
    denominator = int(np.sum(predicted)) + int(np.sum(actual))  # (TP + FP) + (TP + FN)
    return 2 * int(np.sum(predicted & actual)) / denominator if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation coefficient (Gorodkin's multiclass form; the usual MCC for 2 classes).

    With the confusion matrix ``C`` (rows: labels, columns: predictions), ``s = ΣC``,
    ``c = tr C``, ``t_k`` the label counts and ``p_k`` the prediction counts::

        MCC = (c·s − Σ p_k t_k) / sqrt((s² − Σ p_k²) · (s² − Σ t_k²))

    which for two classes equals ``(TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))``.

    Parameters
    ----------
    predictions, labels : array-like of shape (n,)
        Class ids.

    Returns
    -------
    float in [-1, 1]; 0.0 when undefined, i.e. when the predictions or the labels are
    constant (a zero factor in the denominator).
    """
    predictions, labels = _as_pair(predictions, labels)
    classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    n = len(labels)
    t = np.bincount(encoded[:n], minlength=len(classes)).astype(np.float64)
    p = np.bincount(encoded[n:], minlength=len(classes)).astype(np.float64)
    c = float(np.sum(encoded[:n] == encoded[n:]))
    s = float(n)
    denominator = (s * s - p @ p) * (s * s - t @ t)
    if denominator == 0:
        return 0.0
    return float((c * s - p @ t) / np.sqrt(denominator))


def pearson(predictions, labels) -> float:
    """Pearson correlation coefficient.

    Parameters
    ----------
    predictions, labels : array-like of shape (n,)
        Real-valued scores.

    Returns
    -------
    float in [-1, 1]; 0.0 when either vector is constant (the coefficient is undefined).
    """
    predictions, labels = _as_pair(predictions, labels)
    x = predictions.astype(np.float64) - np.mean(predictions, dtype=np.float64)
    y = labels.astype(np.float64) - np.mean(labels, dtype=np.float64)
    denominator = np.sqrt((x @ x) * (y @ y))
    if denominator == 0:
        return 0.0
    return float(np.clip((x @ y) / denominator, -1.0, 1.0))


def spearman(predictions, labels) -> float:
    """Spearman rank correlation: the Pearson correlation of the ranks (ties get their average rank).

    Parameters
    ----------
    predictions, labels : array-like of shape (n,)
        Real-valued scores.

    Returns
    -------
    float in [-1, 1]; 0.0 when either vector is constant (the coefficient is undefined).
    """
    # here, not at the top: scipy.stats takes about 1 s to import, and only STS-B needs it
    from scipy.stats import rankdata

    predictions, labels = _as_pair(predictions, labels)
    return pearson(rankdata(predictions, method="average"), rankdata(labels, method="average"))


# --------------------------------------------------------------------------------------
# SQuAD
# --------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Normalise an answer for SQuAD scoring.

    Lower-cases, removes ASCII punctuation (``string.punctuation``), removes the articles
    "a", "an" and "the" as whole words, and collapses runs of whitespace to one space
    (no leading or trailing space).
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _ground_truth_list(ground_truths: str | Sequence[str]) -> list[str]:
    """A single string is one ground truth; an empty collection is an error."""
    if isinstance(ground_truths, str):
        return [ground_truths]
    ground_truths = list(ground_truths)
    if not ground_truths:
        raise ValueError("ground_truths is empty; SQuAD v1.1 questions have at least one answer")
    return ground_truths


def exact_match_score(prediction: str, ground_truths: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised ground truth, else 0.0.

    Parameters
    ----------
    prediction : str
    ground_truths : str or sequence of str
        The accepted answers (a single string counts as one answer).

    Returns
    -------
    float, 0.0 or 1.0.
    """
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(truth) for truth in _ground_truth_list(ground_truths)))


def _token_f1(prediction_tokens: list[str], truth_tokens: list[str]) -> float:
    """Bag-of-tokens F1; 0.0 when there is no common token (including when either side is empty)."""
    common = sum((Counter(prediction_tokens) & Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, ground_truths: str | Sequence[str]) -> float:
    """Token-level F1 of the prediction, maximised over the ground truths.

    Both sides are normalised with :func:`normalize_answer` and split on whitespace; the
    overlap counts each token as many times as it occurs on both sides.  As in SQuAD v1.1,
    the F1 is 0.0 when there is no common token, even if both sides normalise to "".

    Parameters
    ----------
    prediction : str
    ground_truths : str or sequence of str
        The accepted answers (a single string counts as one answer).

    Returns
    -------
    float in [0, 1].
    """
    prediction_tokens = normalize_answer(prediction).split()
    return max(_token_f1(prediction_tokens, normalize_answer(truth).split())
               for truth in _ground_truth_list(ground_truths))


def squad_metrics(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v1.1 exact match and F1 over a set of questions.

    Parameters
    ----------
    predictions : mapping of question id -> predicted answer text
        A question without a prediction scores 0 on both metrics.
    references : mapping of question id -> list of accepted answer texts
        Defines the questions averaged over.

    Returns
    -------
    dict with ``"exact_match"`` and ``"f1"``, each a percentage in [0, 100] (mean over the
    questions of ``references``).

    Raises
    ------
    ValueError
        If ``references`` is empty or ``predictions`` has an id that is not in ``references``.
    """
    if not references:
        raise ValueError("references is empty")
    unknown = [key for key in predictions if key not in references]
    if unknown:
        raise ValueError(f"{len(unknown)} prediction(s) for question ids not in references, e.g. {unknown[:3]!r}")
    answered = [(predictions[key], truths) for key, truths in references.items() if key in predictions]
    return {name: 100.0 * sum(score(prediction, truths) for prediction, truths in answered) / len(references)
            for name, score in (("exact_match", exact_match_score), ("f1", f1_score))}


# --------------------------------------------------------------------------------------
# per-task dispatch
# --------------------------------------------------------------------------------------

_METRICS = {"accuracy": accuracy, "f1": f1_binary, "matthews": matthews_corrcoef, "pearson": pearson,
            "spearman": spearman}


def compute_metrics(task, predictions, labels) -> dict[str, float]:
    """Every metric that ``task.metrics`` names, for a classification or regression task.

    Parameters
    ----------
    task : istar.registry.tasks.Task
        The task, e.g. ``get_task("cola")``: its ``kind``, ``num_labels`` and ``metrics``.
    predictions : array-like of shape (n,)
        Class ids in ``[0, num_labels)`` for classification (argmax of the logits, not the
        logits), real-valued scores for regression (STS-B).
    labels : array-like of shape (n,)
        Gold class ids (same range) or gold scores.

    Returns
    -------
    dict mapping each metric name of the task, in the registry's order, to its value:
    ``accuracy`` and ``f1`` as fractions in [0, 1], ``matthews``, ``pearson`` and
    ``spearman`` in [-1, 1].

    Raises
    ------
    ValueError
        For a qa task (use :func:`squad_metrics`), for empty or mismatched inputs, and for
        classification ids outside ``[0, num_labels)`` (e.g. the ``-1`` labels of an
        unlabelled GLUE test split).
    """
    task_key = task.key
    if task.kind == "qa":
        raise ValueError(f"task {task_key!r} is extractive QA: score text answers with "
                         "istar.core.metrics.squad_metrics (after istar.data.qa.postprocess_predictions), not "
                         "compute_metrics")
    predictions, labels = _as_pair(predictions, labels)
    if task.kind == "classification":
        for name, values in (("predictions", predictions), ("labels", labels)):
            if not np.issubdtype(values.dtype, np.integer):
                raise ValueError(f"{task_key}: {name} must be integer class ids; got dtype {values.dtype}")
            if values.min() < 0 or values.max() >= task.num_labels:
                raise ValueError(f"{task_key}: {name} must be class ids in [0, {task.num_labels}); got values in "
                                 f"[{values.min()}, {values.max()}]")
    return {name: _METRICS[name](predictions, labels) for name in task.metrics}


# --------------------------------------------------------------------------------------
# the trivial predictor: what a run that learned nothing scores
# --------------------------------------------------------------------------------------

COLLAPSE_TOLERANCE = 1e-9
"""How far above the trivial predictor's score a run must be to count as having beaten it (float noise)."""


def trivial_baseline(task, predictions, labels) -> dict[str, float]:
    """The evaluation split's trivial predictor and how spread a run's predictions are.

    A fine-tuning run fails when it ends no better than a predictor that ignores its input
    (Mosbach et al. 2021, "On the Stability of Fine-tuning BERT": a run is failed when it does not
    beat the majority classifier). The trivial predictor's score comes from the split's labels:

    - classification: the best score of a constant prediction, ``max_c metric(c, …, c)`` over the
      task's classes (for accuracy, the share of the majority class; for Matthews, 0);
    - regression: the score of the constant label mean (0: a constant has no correlation).

    Parameters
    ----------
    task : istar.registry.tasks.Task
        A classification or regression task (QA: :func:`squad_metrics` of empty answers).
    predictions, labels : array-like of shape (n,)
        As for :func:`compute_metrics`.

    Returns
    -------
    dict with ``trivial_score`` (the headline metric's unit) and, for classification,
    ``top_label_share`` (the share of the most frequent predicted class, in (0, 1]; 1 = one class
    for every example) or, for regression, ``prediction_std`` (the predictions' standard
    deviation, in label units; 0 = a constant).
    """
    predictions, labels = _as_pair(predictions, labels)
    score = _METRICS[task.metric]
    if task.kind == "classification":
        constants = (np.full(len(labels), c, dtype=labels.dtype) for c in range(task.num_labels))
        return {"trivial_score": max(score(constant, labels) for constant in constants),
                "top_label_share": float(np.bincount(predictions).max() / len(predictions))}
    if task.kind == "regression":
        mean = np.full(len(labels), np.mean(labels, dtype=np.float64))
        return {"trivial_score": score(mean, labels), "prediction_std": float(np.std(predictions, dtype=np.float64))}
    raise ValueError(f"task {task.key!r} is {task.kind}: its trivial predictor is squad_metrics of empty answers")


def collapsed(final: Mapping[str, float], metric: str) -> bool | None:
    """Whether a run's evaluation (``final``: its metrics with ``trivial_score``) failed to beat the
    trivial predictor on its headline ``metric``; None when the evaluation did not record the
    trivial score (runs evaluated before it was)."""
    trivial = final.get("trivial_score")
    if trivial is None or final.get(metric) is None:
        return None
    return bool(final[metric] <= trivial + COLLAPSE_TOLERANCE)
