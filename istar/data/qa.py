"""Extractive question answering (SQuAD v1.1): windowed features and span post-processing.

A (question, context) pair longer than ``max_length`` tokens is split into overlapping
*windows*: every window holds the whole question and a slice of the context, and consecutive
slices share ``stride`` context tokens.  Character offsets, which map tokens back to the
original context, come from a fast (Rust ``tokenizers``) tokenizer; slow tokenizers do not
provide them.

The windows are padded to ``max_length`` on the right, so index 0 is the classification
token ([CLS] for BERT, ALBERT and DistilBERT): the position that training targets point at
when a window does not contain the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MODEL_INPUTS", "prepare_train_features", "prepare_eval_features",
           "postprocess_predictions"]

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""What a model is called with (``token_type_ids`` only where the tokenizer makes them)."""

_CONTEXT = 1  # the sequence id of the context (the second text of each pair)
_NO_ANSWER = 0  # the token index targeted when a window does not contain the answer


def _tokenize(questions: Sequence[str], contexts: Sequence[str], tokenizer, max_length: int, stride: int):
    """Tokenise (question, context) pairs into padded, overlapping windows with character offsets."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer: extractive QA needs the character "
                         "offsets (return_offsets_mapping) that only fast tokenizers provide; load it with "
                         "AutoTokenizer.from_pretrained(..., use_fast=True)")
    if len(questions) == 0:
        raise ValueError("no examples to tokenise")
    # Leading whitespace in a question takes no token but would only shift its offsets.
    return tokenizer([question.lstrip() for question in questions], list(contexts), truncation="only_second",
                     max_length=max_length, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                     padding="max_length")


def _model_inputs(encoding) -> dict[str, list]:
    """The :data:`MODEL_INPUTS` of an encoding."""
    return {name: encoding[name] for name in MODEL_INPUTS if name in encoding}


def _check_lengths(**columns: Sequence) -> None:
    """Parallel inputs: a ValueError naming each one's length unless they are all as long."""
    if len({len(values) for values in columns.values()}) > 1:
        raise ValueError("parallel inputs of different lengths: got "
                         + ", ".join(f"{len(values)} {name}" for name, values in columns.items()))


def prepare_train_features(questions: Sequence[str], contexts: Sequence[str], answer_starts: Sequence[Sequence[int]],
                           answer_texts: Sequence[Sequence[str]], tokenizer, max_length: int = 384,
                           stride: int = 128) -> dict[str, list]:
    """Training windows with the token span of the first answer.

    Parameters
    ----------
    questions, contexts : sequence of str, length n_examples
    answer_starts : sequence of length n_examples of sequences of int
        Character offsets of each example's answers in its context (the ``answer_starts``
        column); only the first answer is used as the training target.
    answer_texts : sequence of length n_examples of sequences of str
        The answers' texts (the ``answer_texts`` column), parallel to ``answer_starts``.
    tokenizer : fast Hugging Face tokenizer
    max_length : int, default 384
        Tokens per window, special tokens and question included.
    stride : int, default 128
        Context tokens shared by consecutive windows of one example.

    Returns
    -------
    dict of lists, each of length n_windows (≥ n_examples):
        ``input_ids``, ``attention_mask`` and, if the tokenizer makes them,
        ``token_type_ids``: lists of ``max_length`` ints;
        ``start_positions``, ``end_positions``: int token indices (inclusive) of the first
        answer when it lies entirely in the window's context, else both 0 (the [CLS] index).

    The answers are taken as :func:`istar.data.normalise.answer_problem` accepts them (a prepared
    split's all are).

    Raises
    ------
    ValueError
        For a slow tokenizer or inputs of different lengths.
    """
    _check_lengths(questions=questions, contexts=contexts, answer_starts=answer_starts, answer_texts=answer_texts)
    # positional access below: pandas columns would otherwise be indexed by label
    answer_starts, answer_texts = list(answer_starts), list(answer_texts)
    encoding = _tokenize(questions, contexts, tokenizer, max_length, stride)

    start_positions, end_positions = [], []
    for window, example in enumerate(encoding["overflow_to_sample_mapping"]):
        answer_start = answer_starts[example][0]
        answer_end = answer_start + len(answer_texts[example][0])  # exclusive
        offsets = encoding["offset_mapping"][window]
        context_tokens = [i for i, seq in enumerate(encoding.sequence_ids(window)) if seq == _CONTEXT]
        if offsets[context_tokens[0]][0] <= answer_start and answer_end <= offsets[context_tokens[-1]][1]:
            # first context token ending after the answer starts; last one starting before it ends
            start_positions.append(next(i for i in context_tokens if offsets[i][1] > answer_start))
            end_positions.append(next(i for i in reversed(context_tokens) if offsets[i][0] < answer_end))
        else:
            start_positions.append(_NO_ANSWER)
            end_positions.append(_NO_ANSWER)

    return {**_model_inputs(encoding), "start_positions": start_positions, "end_positions": end_positions}


def prepare_eval_features(ids: Sequence[str], questions: Sequence[str], contexts: Sequence[str], tokenizer,
                          max_length: int = 384, stride: int = 128) -> dict[str, list]:
    """Evaluation windows, with what :func:`postprocess_predictions` needs to map spans back to text.

    Parameters
    ----------
    ids : sequence of str, length n_examples
        Question ids (the ``id`` column).
    questions, contexts, tokenizer, max_length, stride
        As in :func:`prepare_train_features`.

    Returns
    -------
    dict of lists, each of length n_windows (≥ n_examples): the model inputs as in
        :func:`prepare_train_features`;
        ``example_id``: the id of the example each window comes from;
        ``offset_mapping``: lists of ``max_length`` entries, ``(char_start, char_end)`` into
        the context for context tokens and None for question, special and padding tokens.

    Raises
    ------
    ValueError
        For a slow tokenizer or inputs of different lengths.
    """
    _check_lengths(ids=ids, questions=questions, contexts=contexts)
    encoding = _tokenize(questions, contexts, tokenizer, max_length, stride)
    ids = list(ids)  # positional access below: a pandas column would otherwise be indexed by label
    offset_mapping = [[tuple(offset) if seq == _CONTEXT else None
                       for offset, seq in zip(offsets, encoding.sequence_ids(window))]
                      for window, offsets in enumerate(encoding["offset_mapping"])]
    example_ids = [ids[example] for example in encoding["overflow_to_sample_mapping"]]
    return {**_model_inputs(encoding), "example_id": example_ids, "offset_mapping": offset_mapping}


def postprocess_predictions(example_ids: Sequence[str], contexts: Sequence[str], features: dict[str, list],
                            start_logits, end_logits, n_best: int = 20, max_answer_length: int = 30) -> dict[str, str]:
    """The best-scoring context span of each example, as text.

    For every window of an example, the ``n_best`` highest start logits and ``n_best``
    highest end logits are paired; a pair (s, e) is a valid span when both tokens are context
    tokens, ``e ≥ s`` and ``e − s + 1 ≤ max_answer_length``, and scores
    ``start_logits[s] + end_logits[e]``.  The best valid span over all the example's windows
    is returned as ``context[offset_mapping[s][0]:offset_mapping[e][1]]`` (original casing
    and spacing).

    Parameters
    ----------
    example_ids : sequence of str, length n_examples
        The examples' distinct ids (a prepared split's are), as passed to :func:`prepare_eval_features`.
    contexts : sequence of str, length n_examples
        Their contexts.
    features : dict
        The output of :func:`prepare_eval_features`; ``example_id`` and ``offset_mapping``
        are used.
    start_logits, end_logits : array-like of shape (n_windows, max_length)
        The model's span logits for each window, in the order of ``features``.
    n_best : int, default 20
        Start and end candidates per window.
    max_answer_length : int, default 30
        Longest answer, in tokens.

    Returns
    -------
    dict mapping each example id to its answer text ("" when no window has a valid span
    among its candidates).

    Raises
    ------
    ValueError
        For inconsistent shapes or lengths, a window of an unknown example, or a non-positive
        ``n_best`` or ``max_answer_length``.
    """
    _check_lengths(example_ids=example_ids, contexts=contexts)
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best and max_answer_length must be ≥ 1; got {n_best} and {max_answer_length}")
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    offset_mapping = features["offset_mapping"]
    _check_lengths(example_id=features["example_id"], offset_mapping=offset_mapping)
    expected = (len(offset_mapping), len(offset_mapping[0]) if offset_mapping else 0)
    if start_logits.shape != expected or end_logits.shape != expected:
        raise ValueError(f"start_logits and end_logits must have shape (n_windows, max_length) = {expected}; "
                         f"got {start_logits.shape} and {end_logits.shape}")

    context_of = dict(zip(example_ids, contexts))
    best: dict[str, tuple[float, str]] = {key: (-np.inf, "") for key in example_ids}
    for window, key in enumerate(features["example_id"]):
        if key not in context_of:
            raise ValueError(f"window {window} belongs to example {key!r}, which is not in example_ids")
        offsets = offset_mapping[window]
        in_context = np.array([offset is not None for offset in offsets])
        starts = np.argsort(-start_logits[window], kind="stable")[:n_best]
        ends = np.argsort(-end_logits[window], kind="stable")[:n_best]
        lengths = ends[None, :] - starts[:, None] + 1  # (n_best, n_best): rows starts, columns ends
        valid = in_context[starts][:, None] & in_context[ends][None, :]
        valid &= (lengths >= 1) & (lengths <= max_answer_length)
        pair_scores = start_logits[window][starts][:, None] + end_logits[window][ends][None, :]
        scores = np.where(valid, pair_scores, -np.inf)
        s, e = np.unravel_index(np.argmax(scores), scores.shape)
        if scores[s, e] > best[key][0]:  # never true of a window without a valid span: all its scores are -inf
            best[key] = (float(scores[s, e]), context_of[key][offsets[starts[s]][0] : offsets[ends[e]][1]])
    return {key: text for key, (_, text) in best.items()}
