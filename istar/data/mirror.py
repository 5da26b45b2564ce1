"""Tasks from a local mirror of the public release files (offline), with their sha256 in the provenance.

The mirror is a folder in the releases' layout::

    glue/{CoLA,SST-2,MRPC,RTE,STS-B,QNLI,QQP}/{train,dev}.tsv
    sst5/{train,dev}.txt                      Penn-treebank trees, root label 0-4
    squad/{train,dev}-v1.1.json

It is named by the caller (``--mirror``, the config's ``data.mirror``) or ``$ISTAR_DATA_MIRROR``;
there is no default folder. A split missing from it raises :class:`MissingSplitError`, unless a
stand-in is allowed: then the split that is there is divided (:func:`standin_split`, seeded; SQuAD by
article, so no context is in both parts), ``meta.json`` says ``"standin": true`` and results on it are
not comparable with published scores (docs/method.md §6).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from istar.data.hub import hub_source
from istar.data.normalise import normalise_split
from istar.data.readers import GLUE_TSV, read_glue_tsv, read_squad_json, read_sst5
from istar.io.artifacts import file_digest
from istar.registry import lookup
from istar.registry.tasks import SPLITS, Task

__all__ = ["MIRROR_ENV", "MissingSplitError", "IncompleteSplitError", "mirror_file", "missing_mirror_files",
           "load_mirror", "standin_split"]

logger = logging.getLogger(__name__)

MIRROR_ENV = "ISTAR_DATA_MIRROR"


class MissingSplitError(ValueError):
    """A split of a task is not in the mirror (and no stand-in was allowed or possible)."""


_RELEASE_FILES = {**{key: f"{layout.folder}/{{}}.tsv" for key, layout in GLUE_TSV.items()},
                  "sst5": "sst5/{}.txt", "squad": "squad/{}-v1.1.json"}
"""Task key -> its release file relative to the mirror root (posix), ``{}`` the file's split: train or dev."""


def mirror_file(task: str, split: str) -> str:
    """The release file of ``task``'s ``split``, relative to the mirror root (posix)."""
    return lookup(_RELEASE_FILES, task, "task").format("train" if split == "train" else "dev")


def missing_mirror_files(task: str, mirror: str | Path) -> list[Path]:
    """The release files of ``task`` (train and validation) that are not in the mirror folder."""
    paths = [Path(mirror) / mirror_file(task, split) for split in SPLITS]
    return [path for path in paths if not path.is_file()]


class IncompleteSplitError(ValueError):
    """A mirror file whose row count differs from the official split's, and no subset was declared."""


def _read_mirror_split(task: Task, path: Path, split: str, subset: bool) -> tuple[pd.DataFrame, list[str]]:
    """Read, normalise and check one mirror file; the split and its dropped rows.

    Unless ``subset``, the rows read (before any is dropped) must number the official split's
    (:attr:`istar.registry.tasks.Task.rows`): a file cut at a line end parses cleanly and would
    otherwise pass as the whole split.
    """
    logger.info("reading %s", path)
    frame, places = (read_squad_json(path) if task.kind == "qa" else read_sst5(path) if task.key == "sst5"
                     else read_glue_tsv(path, task))
    official = task.rows[SPLITS.index(split)]
    if not subset and len(frame) != official:
        raise IncompleteSplitError(
            f"{path} holds {len(frame):,} rows, but the official {task.display} {split} split has {official:,}: "
            "the file is incomplete or not the release's (a copy cut short?); copy it again, or, if the mirror "
            "holds a subset on purpose, say so with data.subset: true (istar prepare-data --subset)")
    return normalise_split(frame, task, lambda i: f"{path}, {places[i]}")


def load_mirror(task: Task, root: Path, allow_standin: bool, standin_fraction: float,
                seed: int, subset: bool = False) -> tuple[dict[str, pd.DataFrame], dict]:
    """The task's splits read from the mirror folder ``root`` (a stand-in if allowed and needed).

    Returns the normalised splits and the provenance (``source``, ``mirror``, ``files``: release file ->
    sha256, ``standin``, ``standin_note`` where it is one, ``dropped_rows``). Raises
    :class:`MissingSplitError`, and :class:`IncompleteSplitError` for a file whose row count is
    not the official one unless ``subset`` says the mirror holds a subset on purpose.
    """
    # recorded as given (a folder named relative to the project stays so: the data's fingerprint is then the same
    # in every clone of the project), read where it resolves
    given, root = str(root), root.resolve()
    files = {split: mirror_file(task.key, split) for split in SPLITS}
    missing = [split for split in SPLITS if not (root / files[split]).is_file()]
    available = next((split for split in SPLITS if split not in missing), None)
    if missing and (available is None or not allow_standin):
        raise MissingSplitError(_missing_split_message(task, root, missing, available, standin_fraction, seed))
    provenance = {"source": "mirror", "mirror": given, "files": {}, "standin": bool(missing), "dropped_rows": {}}
    splits = {}
    for split in [split for split in SPLITS if split not in missing]:
        splits[split], provenance["dropped_rows"][split] = _read_mirror_split(task, root / files[split], split, subset)
        provenance["files"][files[split]] = file_digest(root / files[split])
    if missing:
        train, validation, how = standin_split(splits[available], task, standin_fraction, seed)
        provenance["standin_note"] = (
            f"STAND-IN: {root / files[missing[0]]} is missing from the mirror, so the {available} file "
            f"{files[available]} ({len(splits[available]):,} rows) was split with seed {seed} (validation fraction "
            f"{standin_fraction:g}, {how}) into a stand-in train part of {len(train):,} rows and a stand-in validation "
            f"part of {len(validation):,} rows. No row is in both. Scores on this split are not comparable with "
            f"published {task.display} results.")
        splits = {"train": train, "validation": validation}
    return splits, provenance


def _missing_split_message(task: Task, root: Path, missing: list[str], available: str | None,
                           standin_fraction: float, seed: int) -> str:
    """The text of :class:`MissingSplitError`: what is missing, where, and the options."""
    paths = " and ".join(str(root / mirror_file(task.key, split)) for split in missing)
    head = (f"{task.display}: the {' and '.join(missing)} split{'s are' if len(missing) > 1 else ' is'} not in the "
            f"mirror; expected {paths} (the public release's file name and layout).")
    hub = f"use the Hugging Face hub on a machine with internet (`--source hub`; dataset {hub_source(task.key).hub_id})"
    if available is None:
        return (f"{head} A stand-in needs at least one of the splits, so none is possible. "
                f"Options: put the release files there; or {hub}.")
    by_article = ", by article title so no context is in both" if task.kind == "qa" else ""
    standin = (f"opt into a stand-in with `--allow-standin` (allow_standin=True): the {available} file "
               f"{root / mirror_file(task.key, available)} is split with seed {seed} into a stand-in train part "
               f"({1 - standin_fraction:.0%}) and a stand-in validation part ({standin_fraction:.0%}){by_article}; "
               "meta.json then says \"standin\": true, and scores are not comparable with published ones")
    return f"{head} Options: put the release file there; or {hub}; or {standin}."


def standin_split(frame: pd.DataFrame, task: Task, fraction: float,
                  seed: int) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Split one split into a stand-in train part and a stand-in validation part.

    About ``fraction`` of the rows go to the validation part: chosen at random (seeded)
    for classification and regression; for SQuAD whole articles (``title``) are drawn in a
    seeded random order until the part holds ``fraction`` of the questions. Both parts keep
    the original row order. Returns (train part, validation part, a sentence describing it).
    """
    rng = np.random.default_rng((seed, 0))
    if task.kind == "qa":
        titles = frame["title"].unique()
        if len(titles) < 2:
            raise ValueError(f"{task.display}: a stand-in split by title needs two or more articles, "
                             f"found {len(titles)}")
        drawn = titles[rng.permutation(len(titles))][:-1]
        sizes = frame["title"].value_counts()[drawn].to_numpy()
        # drawn in turn while the part holds fewer questions than asked: the titles whose predecessors hold fewer
        chosen = drawn[np.cumsum(sizes) - sizes < fraction * len(frame)]
        in_validation = frame["title"].isin(chosen).to_numpy()
        how = (f"whole articles drawn at random by title: {len(titles) - len(chosen)} for train, {len(chosen)} for "
               "validation, so no context is in both")
    else:
        if len(frame) < 2:
            raise ValueError(f"{task.display}: a stand-in split needs two or more rows, found {len(frame)}")
        n_validation = min(max(1, round(fraction * len(frame))), len(frame) - 1)
        in_validation = np.isin(np.arange(len(frame)), rng.choice(len(frame), size=n_validation, replace=False))
        how = "rows drawn at random"
    return frame.loc[~in_validation].reset_index(drop=True), frame.loc[in_validation].reset_index(drop=True), how

