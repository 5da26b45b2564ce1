"""Loading a task from its source, subsampling it, and the ``istar prepare-data`` command."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from istar.config.schema import default_of, out_of_range, schema_entry
from istar.data.hub import HubUnavailableError, hub_source, load_hub
from istar.data.mirror import MIRROR_ENV, load_mirror
from istar.data.storage import write_prepared
from istar.registry.tasks import SPLITS, get_task

__all__ = ["load_task", "prepare_task", "prepare_from_spec", "run_cli"]

logger = logging.getLogger(__name__)

def load_task(task: str, source: str = "auto", mirror: str | Path | None = None, allow_standin: bool = False,
              standin_fraction: float = default_of("data.standin_fraction"), seed: int = 0, revision: str | None = None,
              subset: bool = False, hub_dataset: str | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """Load a task's train and validation splits, normalised.

    Parameters
    ----------
    task : str
        Task key of :data:`istar.registry.tasks.TASKS` (``"rte"``, ``"sst2"``, ``"squad"``, ...).
    source : {"auto", "hub", "mirror"}, default="auto"
        Where to read from; ``"auto"`` uses the mirror when one is named and its folder
        exists, else the hub.
    mirror : str or Path, optional
        The mirror folder; default ``$ISTAR_DATA_MIRROR``. There is no default folder:
        ``source="mirror"`` without either is an error.
    allow_standin : bool, default=False
        When one split is missing from the mirror, split the other one into a stand-in
        train part and a stand-in validation part instead of raising.
    standin_fraction : float in (0, 1), default: the schema's ``data.standin_fraction``
        Share of the available split that becomes the stand-in validation part.
    seed : int >= 0, default=0
        Seed of the stand-in split.
    revision : str, optional
        The hub dataset's revision (branch, tag or 40-hex commit; default ``main``), resolved
        to its commit before loading. Hub sources only.
    subset : bool, default=False
        The mirror holds a subset of the release's rows on purpose (config/demo-data). Without
        it a mirror file whose row count is not the official one (a file cut short) raises.
    hub_dataset : str, optional
        Which of the task's hub datasets (:data:`istar.data.hub.HUB_SOURCES`; default its
        first). Hub sources only: a mirror holds the release the first one equals.

    Returns
    -------
    splits : dict
        ``{"train": DataFrame, "validation": DataFrame}``, columns as in :mod:`istar.registry.tasks`:
        ``idx, text_a, text_b, label`` (n_rows rows), or for SQuAD ``id, title, context,
        question, answer_texts, answer_starts`` (one row per question).
    provenance : dict
        ``source`` ("mirror" or "hub"), ``mirror`` (the folder as given, or None), ``hub_id``,
        ``hub_config``, ``hub_revision`` (as asked) and ``hub_commit`` (as loaded; or None), ``files``
        (mirror file -> sha256), ``standin`` (bool),
        ``standin_note`` (str or None), ``dropped_rows`` (split read -> locations of rows
        dropped for an empty text; QQP only), ``source_requested`` (the ``source`` argument).

    Raises
    ------
    MissingSplitError
        A split is missing from the mirror and no stand-in was allowed or possible.
    IncompleteSplitError
        A mirror file's row count is not the official split's and ``subset`` is False.
    HubUnavailableError
        The hub could not be reached (the message suggests the mirror).
    FileNotFoundError
        ``source="mirror"`` and the mirror folder does not exist.
    ValueError
        Unknown task, an argument outside its ``data.*`` range in the config schema, or malformed data
        (naming file and line).
    """
    entry = get_task(task)
    _check_settings(source=source, standin_fraction=standin_fraction, seed=seed)
    origin = "the mirror argument"  # where the folder was named, for the messages
    if mirror is None and os.environ.get(MIRROR_ENV):
        mirror, origin = os.environ[MIRROR_ENV], f"${MIRROR_ENV}"
    root = None if mirror is None else Path(mirror)
    if source == "mirror" and root is None:
        raise ValueError(f"data source 'mirror' needs a mirror folder (none is named): pass --mirror DIR (the "
                         f"config's data.mirror) or set ${MIRROR_ENV} to a folder in the GLUE release layout")
    if source == "mirror" and not root.is_dir():
        raise FileNotFoundError(f"mirror folder {root.absolute()} does not exist (from {origin}). Pass --mirror "
                                f"(or set ${MIRROR_ENV}) to a folder in the GLUE release layout, or use --source hub "
                                "on a machine with internet.")
    if source == "hub" or (source == "auto" and (root is None or not root.is_dir())):
        if source == "auto":
            logger.warning("data source auto: no mirror folder (%s), so %s comes from the hub",
                           f"{origin}: {root}" if root else f"no --mirror and no ${MIRROR_ENV}", entry.key)
        splits, provenance = load_hub(entry, revision, hub_dataset)
    else:
        if revision is not None:
            raise ValueError(f"a dataset revision ({revision!r}) applies to the hub only, but {entry.key} comes "
                             f"from the mirror {root}; drop the revision or use source 'hub'")
        release = hub_source(entry.key).hub_id
        if hub_source(entry.key, hub_dataset).hub_id != release:
            raise ValueError(f"the hub dataset {hub_dataset!r} applies to the hub only, but {entry.key} comes from the "
                             f"mirror {root}, which holds the release of {release}; use source 'hub' or "
                             f"data.hub_datasets.{entry.key}: {release}")
        splits, provenance = load_mirror(entry, root, allow_standin, standin_fraction, seed, subset)
    # every source's provenance has every key: what a source does not have is None (or empty)
    return splits, {"mirror": None, "hub_id": None, "hub_config": None, "hub_revision": None, "hub_commit": None,
                    "files": {}, "standin": False, "standin_note": None, **provenance, "source_requested": source}


def _check_settings(**values) -> None:
    """A ValueError for the first value out of the range of its setting ``data.NAME`` in the schema (the range
    the config and the step's spec are held to)."""
    for name, value in values.items():
        if problem := out_of_range(value, schema_entry(f"data.{name}")):
            raise ValueError(f"{name} must {problem}; got {value!r}")


def _subsample(frame: pd.DataFrame, max_samples: int | None, seed: int, stream: int) -> pd.DataFrame:
    """At most ``max_samples`` rows drawn without replacement (seeded), in their order."""
    if max_samples is None or max_samples >= len(frame):
        return frame
    keep = np.sort(np.random.default_rng((seed, stream)).choice(len(frame), size=max_samples, replace=False))
    return frame.iloc[keep].reset_index(drop=True)


def prepare_task(task: str, out_dir: str | Path, source: str = "auto", mirror: str | Path | None = None,
                 allow_standin: bool = False, max_train_samples: int | None = None, max_eval_samples: int | None = None,
                 seed: int = 0, standin_fraction: float = default_of("data.standin_fraction"),
                 revision: str | None = None, subset: bool = False, hub_dataset: str | None = None) -> dict:
    """Load a task, subsample it and write ``train.parquet``, ``validation.parquet``, ``meta.json``.

    Parameters
    ----------
    task, source, mirror, allow_standin, standin_fraction, seed, revision, subset, hub_dataset
        As in :func:`load_task`; ``seed`` also drives the subsampling.
    out_dir : str or Path
        Folder to write to (created if needed). A ``meta.json`` already there is removed
        first and written last, so its presence means the folder is complete.
    max_train_samples, max_eval_samples : int >= 1, optional
        Keep at most this many train / validation rows (SQuAD: questions), drawn at random
        without replacement with ``seed`` and kept in their original order. None keeps all.

    Returns
    -------
    meta : dict
        What ``meta.json`` holds: ``task``, ``source``, ``source_requested``, ``mirror``,
        ``hub_id``, ``hub_config``, ``hub_revision``, ``hub_commit``, ``files`` (mirror file -> sha256), ``standin``,
        ``standin_note``, ``standin_fraction`` (None unless a stand-in), ``subset`` (as given), ``dropped_rows``,
        ``rows_before_subsampling`` and ``rows`` (split -> count), ``split_sha256`` (parquet file -> hash,
        checked by :func:`istar.data.read_split`), ``max_train_samples``,
        ``max_eval_samples``, ``seed``, ``labels`` (split -> label counts, score range or,
        for SQuAD, article count), ``created`` (UTC, ISO 8601), ``istar_version``.
    """
    entry = get_task(task)
    _check_settings(max_train_samples=max_train_samples, max_eval_samples=max_eval_samples)
    splits, provenance = load_task(task, source=source, mirror=mirror, allow_standin=allow_standin,
                                   standin_fraction=standin_fraction, seed=seed, revision=revision, subset=subset,
                                   hub_dataset=hub_dataset)
    caps = {"train": max_train_samples, "validation": max_eval_samples}
    kept = {split: _subsample(splits[split], caps[split], seed, stream)
            for stream, split in enumerate(SPLITS, start=1)}
    meta = {"task": entry.key, **provenance, "standin_fraction": standin_fraction if provenance["standin"] else None,
            "subset": subset, "rows_before_subsampling": {split: len(splits[split]) for split in SPLITS},
            "max_train_samples": max_train_samples, "max_eval_samples": max_eval_samples, "seed": seed}
    return write_prepared(out_dir, entry, kept, meta)


def prepare_from_spec(spec) -> dict:
    """:func:`prepare_task` with every setting of a :class:`~istar.config.specs.PrepareDataSpec`."""
    options = {name: value for name, value in dataclasses.asdict(spec).items() if name not in ("task", "out")}
    return prepare_task(spec.task, spec.out, **options)


def run_cli(args: argparse.Namespace) -> int:
    """Run ``prepare-data`` with parsed arguments; print a line per split. Returns the exit code."""
    from istar.config.specs import spec_from_cli

    spec = spec_from_cli(args)
    try:
        meta = prepare_from_spec(spec)
    except (ValueError, OSError, HubUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    origin = meta["mirror"] if meta["source"] == "mirror" else (
        meta["hub_id"] + (f" ({meta['hub_config']})" if meta["hub_config"] else "") + f" @ {meta['hub_commit']}"
    )
    standin = " STAND-IN" if meta["standin"] else ""
    for split in SPLITS:
        print(f"{meta['task']} {split}{standin}: {meta['rows'][split]:,} rows (of "
              f"{meta['rows_before_subsampling'][split]:,}) -> {Path(spec.out) / split}.parquet")
    print(f"source: {meta['source']} {origin}")
    if meta["standin"]:
        print(meta["standin_note"])
    return 0
