"""From normalised splits (see :mod:`istar.registry.tasks`) to tokenised features and data loaders.

Classification and regression examples become one feature each (truncated to
``max_length``, padded per batch). SQuAD examples become one feature per 384-token window
(see :mod:`istar.data.qa`); for evaluation the windows keep their ``example_id`` and
``offset_mapping`` outside the model inputs, for answer post-processing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from istar.config.schema import default_of
from istar.data import qa
from istar.data.qa import MODEL_INPUTS
from istar.registry.tasks import Task

__all__ = ["Features", "encode_split", "EpochShuffleSampler", "make_loader", "MODEL_INPUTS"]


@dataclass
class Features(Dataset):
    """Tokenised features of one split.

    columns : model inputs and targets, one list per key, all of length ``len(self)``.
    example_ids, offset_mapping : for QA evaluation only (window → example, token → characters).
    """

    columns: dict[str, list]
    example_ids: list | None = None
    offset_mapping: list | None = None

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, index: int) -> dict:
        return {key: values[index] for key, values in self.columns.items()}

    def num_tokens(self) -> int:
        """Number of non-padding tokens over all features."""
        return sum(sum(mask) for mask in self.columns["attention_mask"])


def encode_split(frame: Mapping[str, Sequence], task: Task, tokenizer, max_length: int,
                 doc_stride: int = default_of("training.doc_stride"),
                 with_labels: bool = True, for_qa_eval: bool = False, segment_ids: bool = True) -> Features:
    """Tokenise a normalised split.

    Parameters
    ----------
    frame : a split with the columns of :mod:`istar.registry.tasks`: a DataFrame
        (:func:`istar.data.read_split`) or one list per column (:func:`istar.data.read_columns`).
    task : the task (decides pairing and head).
    tokenizer : a fast Hugging Face tokenizer.
    max_length : tokens per feature (QA: window length, 384 in the paper's setup).
    doc_stride : QA only: context tokens shared by consecutive windows.
    with_labels : include targets (``labels``, or ``start_positions``/``end_positions``).
    for_qa_eval : QA only: make evaluation windows with ``example_ids`` and ``offset_mapping``.
    segment_ids : classification and regression: keep the tokenizer's ``token_type_ids`` (where it
        makes them); False leaves them out, so the model reads every position as segment 0, as
        the authors' classification collate does (``training.segment_ids``, docs/method.md §7).
        QA windows always keep them.
    """
    if task.kind == "qa":
        if for_qa_eval:
            encoded = qa.prepare_eval_features(frame["id"], frame["question"], frame["context"], tokenizer,
                                               max_length=max_length, stride=doc_stride)
            return Features(example_ids=encoded.pop("example_id"), offset_mapping=encoded.pop("offset_mapping"),
                            columns=encoded)
        encoded = qa.prepare_train_features(frame["question"], frame["context"], frame["answer_starts"],
                                            frame["answer_texts"], tokenizer, max_length=max_length, stride=doc_stride)
        if not with_labels:
            del encoded["start_positions"], encoded["end_positions"]
        return Features(columns=encoded)

    second = list(frame["text_b"]) if task.paired else None
    encoded = tokenizer(list(frame["text_a"]), second, truncation=True, max_length=max_length)
    columns = {k: encoded[k] for k in MODEL_INPUTS if k in encoded and (segment_ids or k != "token_type_ids")}
    if with_labels:
        columns["labels"] = [(float if task.kind == "regression" else int)(label) for label in frame["label"]]
    return Features(columns=columns)


class EpochShuffleSampler(Sampler[int]):
    """A random order of ``n`` indices fixed by (seed, epoch): call :meth:`set_epoch` each epoch.

    The order depends on nothing else (not the global RNG), so a resumed run sees the same
    batches as an uninterrupted one, and the run seed really changes the data order.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def make_loader(features: Features, tokenizer, batch_size: int, sampler: Sampler | None = None,
                pad_to_multiple_of: int | None = None) -> DataLoader:
    """A DataLoader that pads each batch dynamically; in order unless a sampler is given.

    The loader has its own generator so that creating an iterator never draws from the
    global torch RNG (which would shift dropout masks after a resume).
    """
    from transformers import DataCollatorWithPadding

    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
    return DataLoader(features, batch_size=batch_size, sampler=sampler, shuffle=False, collate_fn=collator,
                      generator=torch.Generator().manual_seed(0))
