"""Tasks from a local mirror of the public release files (offline), with their sha256 in the provenance.

The mirror is a folder in the releases' layout::

    glue/{CoLA,SST-2,MRPC,RTE,STS-B,QNLI,QQP}/{train,dev}.tsv
    sst5/{train,dev}.txt                      Penn-treebank trees, root label 0-4
    squad/{train,dev}-v1.1.json

It is named by the caller (``--mirror``, the config's ``data.mirror``) or ``$ISTAR_DATA_MIRROR``;
there is no default folder. A split missing from it raises :class:`MissingSplitError`, unless a
stand-in is allowed (:mod:`istar.data.standin`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from istar.data.normalise import check_split, conform
from istar.data.readers import GLUE_TSV, read_glue_tsv, read_squad_json, read_sst5
from istar.data.standin import missing_split_message, standin_split
from istar.io.artifacts import file_digest
from istar.registry.tasks import SPLITS, Task, get_task

__all__ = ["MIRROR_ENV", "MissingSplitError", "IncompleteSplitError", "mirror_file", "missing_mirror_files",
           "resolve_mirror", "load_mirror"]

logger = logging.getLogger(__name__)

MIRROR_ENV = "ISTAR_DATA_MIRROR"


class MissingSplitError(ValueError):
    """A split of a task is not in the mirror (and no stand-in was allowed or possible)."""


def mirror_file(task: str, split: str) -> str:
    """The release file of ``task``'s ``split``, relative to the mirror root (posix)."""
    stem = "train" if split == "train" else "dev"
    if task in GLUE_TSV:
        return f"{GLUE_TSV[task].folder}/{stem}.tsv"
    if task == "sst5":
        return f"sst5/{stem}.txt"
    if task == "squad":
        return f"squad/{stem}-v1.1.json"
    raise ValueError(f"no mirror layout for task {task!r}")


def missing_mirror_files(task: str, mirror: str | Path) -> list[Path]:
    """The release files of ``task`` (train and validation) that are not in the mirror folder."""
    root = Path(mirror)
    return [root / mirror_file(get_task(task).key, split) for split in SPLITS
            if not (root / mirror_file(task, split)).is_file()]


def resolve_mirror(mirror: str | Path | None) -> tuple[Path | None, str]:
    """The mirror folder (None when none is named) and where that choice came from (for messages)."""
    if mirror is not None:
        return Path(mirror), "the mirror argument"
    if os.environ.get(MIRROR_ENV):
        return Path(os.environ[MIRROR_ENV]), f"${MIRROR_ENV}"
    return None, f"no --mirror and no ${MIRROR_ENV}"


class IncompleteSplitError(ValueError):
    """A mirror file whose row count differs from the official split's, and no subset was declared."""


def _read_mirror_split(task: Task, path: Path, split: str, subset: bool) -> tuple[pd.DataFrame, list[str]]:
    """Read, normalise and check one mirror file; the split and its dropped rows.

    Unless ``subset``, the rows read (before any is dropped) must number the official split's
    (:attr:`istar.registry.tasks.Task.rows`): a file cut at a line end parses cleanly and would
    otherwise pass as the whole split.
    """
    logger.info("reading %s", path)
    if task.kind == "qa":
        frame = read_squad_json(path)
        ids = frame["id"].tolist()
        locate = lambda i: f"{path}, question id {ids[i]}"  # noqa: E731
    else:
        if task.key == "sst5":
            frame, lines = read_sst5(path)
        else:
            frame, lines = read_glue_tsv(path, GLUE_TSV[task.key], task)
        locate = lambda i: f"{path}, line {lines[i]}"  # noqa: E731
    official = task.rows[SPLITS.index(split)]
    if not subset and len(frame) != official:
        raise IncompleteSplitError(
            f"{path} holds {len(frame):,} rows, but the official {task.display} {split} split has {official:,}: "
            "the file is incomplete or not the release's (a copy cut short?); copy it again, or, if the mirror "
            "holds a subset on purpose, say so with data.subset: true (istar prepare-data --subset)")
    frame, dropped = check_split(frame, task, locate)
    return conform(frame, task), dropped


def load_mirror(task: Task, root: Path, allow_standin: bool, standin_fraction: float,
                seed: int, subset: bool = False) -> tuple[dict[str, pd.DataFrame], dict]:
    """The task's splits read from the mirror folder ``root`` (a stand-in if allowed and needed).

    Returns the normalised splits and the provenance (``mirror``, ``files``: release file ->
    sha256, ``standin``, ``standin_note``, ``dropped_rows``). Raises
    :class:`MissingSplitError`, and :class:`IncompleteSplitError` for a file whose row count is
    not the official one unless ``subset`` says the mirror holds a subset on purpose.
    """
    # recorded as given (a folder named relative to the project stays so: the data's fingerprint is then the same
    # in every clone of the project), read where it resolves
    given, root = str(root), root.resolve()
    paths = {split: root / mirror_file(task.key, split) for split in SPLITS}
    missing = [split for split in SPLITS if not paths[split].is_file()]
    available = next((split for split in SPLITS if split not in missing), None)
    provenance = {
        "source": "mirror",
        "mirror": given,
        "hub_id": None,
        "hub_config": None,
        "files": {},
        "standin": False,
        "standin_note": None,
        "dropped_rows": {},
    }
    if missing and (available is None or not allow_standin):
        raise MissingSplitError(
            missing_split_message(task, root, {split: mirror_file(task.key, split) for split in SPLITS},
                                  missing, available, standin_fraction, seed)
        )
    splits = {}
    for split in SPLITS:
        if split in missing:
            continue
        splits[split], dropped = _read_mirror_split(task, paths[split], split, subset)
        provenance["files"][mirror_file(task.key, split)] = file_digest(paths[split])
        provenance["dropped_rows"][split] = dropped
    if missing:
        source_rows = len(splits[available])
        train, validation, how = standin_split(splits[available], task, standin_fraction, seed)
        splits = {"train": train, "validation": validation}
        provenance["standin"] = True
        provenance["standin_note"] = (
            f"STAND-IN: {paths[missing[0]]} is missing from the mirror, so the {available} "
            f"file {mirror_file(task.key, available)} ({source_rows:,} rows) was split with "
            f"seed {seed} (validation fraction {standin_fraction:g}, {how}) into a stand-in "
            f"train part of {len(train):,} rows and a stand-in validation part of "
            f"{len(validation):,} rows. No row is in both. Scores on this split are not "
            f"comparable with published {task.display} results."
        )
    return splits, provenance

