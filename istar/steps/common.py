"""The model context every model step opens: accelerator, prepared task, tokenizer, model, features.

``train``, ``evaluate``, ``shrinkage``, ``activations`` and ``measure`` (once per run) all start
the same way from the model-and-data part of their spec (:class:`istar.config.specs.ModelData`)::

    context = open_model_context(spec)             # accelerator, meta.json, task, tokenizer, model
    features = context.features("train")           # the split, tokenised for the task's head
    loader = context.loader(features, batch_size)  # padded batches in a fixed order

so device placement, mixed precision and the model's source are handled in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from istar.config.specs import ModelData

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from istar.data.encoding import Features
    from istar.registry.precisions import Precision
    from istar.registry.tasks import Task

__all__ = ["ModelContext", "open_model_context"]


@dataclass
class ModelContext:
    """What :func:`open_model_context` loaded for a model step; ``columns(split)`` and ``features(split)``
    read on demand."""

    spec: ModelData
    accelerator: Accelerator
    meta: dict
    task: Task
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    precision: Precision  # what runs: spec.mixed_precision on this device
    model_path: str  # the folder or hub id the model was loaded from

    @cached_property
    def model_name(self) -> str:
        """The model as the configuration names it (a pin file stands for the source it pins)."""
        from istar.models.loading import configured_source

        return configured_source(self.spec.model)

    @property
    def standin(self) -> bool:
        return bool(self.meta.get("standin", False))

    def columns(self, split: str) -> dict[str, list]:
        """The prepared split, one list per column (read with pyarrow: no pandas in a model step)."""
        from istar.data.storage import read_columns

        return read_columns(self.spec.data_dir, split)

    def features(self, split: str, *, columns=None, with_labels: bool = True, for_qa_eval: bool = False) -> Features:
        """The split encoded for the task (QA: overlapping windows of ``max_length`` with ``doc_stride``)."""
        from istar.data.encoding import encode_split

        columns = self.columns(split) if columns is None else columns
        return encode_split(columns, self.task, self.tokenizer, self.spec.max_length, self.spec.doc_stride,
                            with_labels=with_labels, for_qa_eval=for_qa_eval and self.task.kind == "qa",
                            segment_ids=self.spec.segment_ids)

    def loader(self, features, batch_size: int, *, sampler=None, pad_to_multiple_of: int | None = None) -> DataLoader:
        from istar.data.encoding import make_loader

        return make_loader(features, self.tokenizer, batch_size, sampler=sampler, pad_to_multiple_of=pad_to_multiple_of)


def open_model_context(spec: ModelData, *, model_seed: int | None = None, gradient_accumulation_steps: int = 1,
                       log_with: list | None = None, project_dir: str | None = None) -> ModelContext:
    """Open a model step's context: its accelerator, prepared task, tokenizer and model.

    Parameters
    ----------
    spec : the step's spec (its model, prepared data folder and precision are read; the
        precision runs as :func:`istar.registry.precisions.run_precision` decides for this device).
    model_seed : seed set right before the model is built, so a newly initialised task head
        depends on this seed only (training, Σ_S of a pretrained model); None leaves the
        random state alone.
    gradient_accumulation_steps : passed to the ``Accelerator`` (training only).
    log_with, project_dir : accelerate's trackers and their logging folder (training only, :mod:`istar.steps.tracking`).
    """
    from pathlib import Path

    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState
    from accelerate.utils import parse_flag_from_env, set_seed

    from istar.data import read_meta
    from istar.io.artifacts import verify_digests
    from istar.models.loading import load_model, load_tokenizer, resolve_model_source
    from istar.registry.precisions import run_precision
    from istar.registry.tasks import get_task

    # The device is known before the Accelerator exists (PartialState is the process's shared
    # state); the precision it gets is the one that runs there (istar.registry.precisions).
    # PartialState must read ACCELERATE_USE_CPU as the Accelerator does: created without it, the
    # shared state of a multi-process CPU run (gloo) has one process, and every rank runs alone.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    precision = run_precision(spec.mixed_precision, state.device.type)
    # accelerate keeps one AcceleratorState per process and refuses a second precision in it: a step's
    # Accelerator is the only one its process needs, so what an earlier step in the same process left
    # (a test, a bundle's steps) is dropped first; the shared PartialState (device, ranks) stays.
    AcceleratorState._reset_state()
    accelerator = Accelerator(mixed_precision=precision.key, gradient_accumulation_steps=gradient_accumulation_steps,
                              log_with=log_with or None, project_dir=project_dir)
    meta = read_meta(spec.data_dir)
    task = get_task(meta["task"])
    model_path = resolve_model_source(spec.model)
    if Path(model_path).is_dir():
        verify_digests(model_path)  # a fine-tuned model's files against the hashes recorded when it was saved
    tokenizer = load_tokenizer(spec.model)
    if model_seed is not None:
        set_seed(model_seed)
    model = load_model(spec.model, task)
    return ModelContext(spec=spec, accelerator=accelerator, meta=meta, task=task, tokenizer=tokenizer, model=model,
                        precision=precision, model_path=model_path)
