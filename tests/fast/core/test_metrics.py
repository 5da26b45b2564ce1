"""Tests of istar.core.metrics on hand-computed cases (the arithmetic is written out in comments)."""

import math

import numpy as np
import pytest
from scipy import stats

from istar.core.metrics import (
    accuracy,
    compute_metrics,
    exact_match_score,
    f1_binary,
    f1_score,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_metrics,
)
from istar.registry.tasks import get_task

# ---------------------------------------------------------------- classification


def test_accuracy():
    # matches at positions 0, 2, 4 -> 3/5
    assert accuracy([1, 0, 1, 1, 0], [1, 1, 1, 0, 0]) == pytest.approx(0.6)


def test_f1_binary():
    # TP = 2 (positions 0, 4), FP = 1 (position 1), FN = 1 (position 2)
    # F1 = 2·TP / (2·TP + FP + FN) = 4 / 6
    assert f1_binary([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(2 / 3)
    # precision 1, recall 1/2 -> 2·(1·1/2)/(1 + 1/2) = 2/3, the same value through the other form
    assert f1_binary([1, 0, 0], [1, 1, 0]) == pytest.approx(2 / 3)


def test_f1_binary_without_positives_is_zero():
    assert f1_binary([0, 0, 0], [0, 0, 0]) == 0.0


def test_matthews_binary_confusion_matrix():
    # TP = 3, FN = 2, FP = 1, TN = 4 (n = 10)
    labels = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    # binary formula: (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))
    #               = (12 − 2) / sqrt(4·5·5·6) = 10 / sqrt(600)
    by_hand = 10 / math.sqrt(600)
    # multiclass form: c = 7 correct, s = 10, label counts t = (5, 5), prediction counts p = (6, 4)
    #   (c·s − p·t) / sqrt((s² − p·p)(s² − t·t)) = (70 − 50) / sqrt((100 − 52)(100 − 50)) = 20 / sqrt(2400)
    assert 20 / math.sqrt(2400) == pytest.approx(by_hand)
    assert matthews_corrcoef(preds, labels) == pytest.approx(by_hand)  # 0.408248…


def test_matthews_multiclass():
    # labels (0, 0, 1, 2), predictions (0, 1, 1, 2): c = 3, s = 4, t = (2, 1, 1), p = (1, 2, 1)
    # (c·s − p·t) / sqrt((s² − p·p)(s² − t·t)) = (12 − 5) / sqrt((16 − 6)(16 − 6)) = 7 / 10
    assert matthews_corrcoef([0, 1, 1, 2], [0, 0, 1, 2]) == pytest.approx(0.7)


def test_matthews_extremes_and_undefined():
    assert matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)
    # a constant prediction (or label) vector makes a denominator factor zero: defined as 0.0
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 1, 0]) == 0.0
    assert matthews_corrcoef([0, 1, 1, 0], [0, 0, 0, 0]) == 0.0


# ---------------------------------------------------------------- regression


def test_pearson_and_spearman_match_scipy():
    rng = np.random.default_rng(0)
    labels = rng.uniform(0, 5, size=200)
    preds = np.round(labels + rng.normal(0, 1, size=200))  # rounding creates many ties
    assert pearson(preds, labels) == pytest.approx(stats.pearsonr(preds, labels)[0], abs=1e-12)
    assert spearman(preds, labels) == pytest.approx(stats.spearmanr(preds, labels)[0], abs=1e-12)


def test_spearman_with_ties_by_hand():
    # x = (1, 2, 2, 3) has average ranks (1, 2.5, 2.5, 4); y = (1, 2, 3, 4) has ranks (1, 2, 3, 4)
    # centred: x' = (−1.5, 0, 0, 1.5), y' = (−1.5, −0.5, 0.5, 1.5)
    # x'·y' = 2.25 + 2.25 = 4.5; |x'|² = 4.5; |y'|² = 5  ->  rho = 4.5 / sqrt(4.5·5) = sqrt(0.9)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))


def test_correlations_of_constant_vectors_are_zero():
    assert pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
    assert spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0


@pytest.mark.parametrize("metric", [accuracy, f1_binary, matthews_corrcoef, pearson, spearman])
def test_empty_and_mismatched_inputs_raise(metric):
    with pytest.raises(ValueError, match="empty"):
        metric([], [])
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        metric([0, 1, 1], [0, 1])


# ---------------------------------------------------------------- SQuAD


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The  Quick, brown FOX!", "quick brown fox"),  # case, punctuation, article, spaces
        ("an apple a day", "apple day"),
        ("Theater anatomy", "theater anatomy"),  # articles only as whole words
        ("  Marie   Curie. ", "marie curie"),
        ("A", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match():
    assert exact_match_score("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert exact_match_score("Eiffel", ["Eiffel Tower", "eiffel"]) == 1.0  # any ground truth
    assert exact_match_score("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match_score("", ["dog"]) == 0.0
    assert exact_match_score("the dog", "Dog.") == 1.0  # a single string is one ground truth


def test_f1_partial_overlap():
    # "the big red dog" -> (big, red, dog); "red dog" -> (red, dog); 2 common tokens
    # precision 2/3, recall 2/2 = 1, F1 = 2·(2/3·1)/(2/3 + 1) = (4/3)/(5/3) = 0.8
    assert f1_score("the big red dog", ["red dog"]) == pytest.approx(0.8)


def test_f1_is_the_max_over_ground_truths():
    # vs "big red dog": precision 1, recall 2/3 -> 0.8 (as above, mirrored); vs "cat": 0
    assert f1_score("Red dog", ["big red dog", "cat"]) == pytest.approx(0.8)


def test_f1_counts_repeated_tokens_once_per_occurrence():
    # (dog, dog, dog) vs (dog): 1 common token; precision 1/3, recall 1 -> 2·(1/3)/(4/3) = 0.5
    assert f1_score("dog dog dog", "dog") == pytest.approx(0.5)


def test_f1_empty_prediction_and_empty_normal_forms():
    assert f1_score("", ["dog"]) == 0.0
    # both sides normalise to "": exact match, but SQuAD v1.1's F1 is 0 without a common token
    assert exact_match_score("the", ["a"]) == 1.0
    assert f1_score("the", ["a"]) == 0.0


def test_empty_ground_truths_raise():
    with pytest.raises(ValueError, match="ground_truths is empty"):
        f1_score("dog", [])


def test_squad_metrics_by_hand():
    references = {"q1": ["Marie Curie"], "q2": ["1898", "in 1898"], "q3": ["red dog"]}
    predictions = {
        "q1": "marie curie.",  # EM 1, F1 1
        # (1898, or, 1899) vs (1898): P 1/3, R 1 -> 0.5; vs (in, 1898): P 1/3, R 1/2 -> 2·(1/6)/(5/6) = 0.4
        "q2": "1898 or 1899",  # EM 0, F1 max(0.5, 0.4) = 0.5
        # q3 unanswered: EM 0, F1 0
    }
    scores = squad_metrics(predictions, references)
    assert scores["exact_match"] == pytest.approx(100 * 1 / 3)
    assert scores["f1"] == pytest.approx(100 * 1.5 / 3)


def test_squad_metrics_errors():
    with pytest.raises(ValueError, match="not in references"):
        squad_metrics({"q1": "a", "zzz": "b"}, {"q1": ["a"]})
    with pytest.raises(ValueError, match="references is empty"):
        squad_metrics({}, {})


# ---------------------------------------------------------------- per-task dispatch


def test_compute_metrics_returns_the_registry_metrics():
    # CoLA: the binary case above, plus accuracy 7/10
    labels = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    cola = compute_metrics(get_task("cola"), preds, labels)
    assert list(cola) == ["matthews", "accuracy"]
    assert cola["matthews"] == pytest.approx(10 / math.sqrt(600))
    assert cola["accuracy"] == pytest.approx(0.7)  # a fraction, not a percentage

    mrpc = compute_metrics(get_task("mrpc"), np.array([1, 1, 0, 0, 1]), np.array([1, 0, 1, 0, 1]))
    assert mrpc == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})

    sst5 = compute_metrics(get_task("sst5"), [4, 3, 0], [4, 2, 0])
    assert sst5 == pytest.approx({"accuracy": 2 / 3})

    stsb = compute_metrics(get_task("stsb"), [1, 2, 2, 3], [1.0, 2.0, 3.0, 4.0])
    assert list(stsb) == ["pearson", "spearman"]
    assert stsb["spearman"] == pytest.approx(math.sqrt(0.9))


def test_compute_metrics_errors():
    with pytest.raises(ValueError, match="squad_metrics"):
        compute_metrics(get_task("squad"), ["a"], ["a"])
    with pytest.raises(ValueError, match="unknown task"):
        compute_metrics(get_task("mnli"), [0], [0])
    with pytest.raises(ValueError, match=r"labels must be class ids in \[0, 2\)"):
        compute_metrics(get_task("rte"), [0, 1], [-1, -1])  # an unlabelled test split
    with pytest.raises(ValueError, match="integer class ids"):
        compute_metrics(get_task("sst2"), [0.2, 0.9], [0, 1])
    with pytest.raises(ValueError, match=r"shape \(n,\)"):
        compute_metrics(get_task("sst2"), [[0.2, 0.8], [0.9, 0.1]], [1, 0])  # logits instead of ids
    with pytest.raises(ValueError, match="empty"):
        compute_metrics(get_task("stsb"), [], [])
