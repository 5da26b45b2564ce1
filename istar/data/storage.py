"""A prepared task folder: ``train.parquet``, ``validation.parquet`` and ``meta.json``.

Each file is written atomically; ``meta.json`` is removed first and written last, so its
presence means the folder is complete.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from istar import __version__
from istar.io import artifacts
from istar.registry.tasks import SPLITS, TASKS, Task

if TYPE_CHECKING:
    import pandas as pd

# pandas and pyarrow are imported inside the functions: the model steps read a split with
# read_columns (pyarrow only, when the step reads its data) and must not pay pandas' import.

__all__ = ["write_prepared", "label_summary", "read_split", "read_columns", "read_meta", "data_fingerprint"]


def write_prepared(out_dir: str | Path, task: Task, splits: dict[str, pd.DataFrame], meta: dict) -> dict:
    """Write the splits (normalised frames, see :mod:`istar.registry.tasks`) and ``meta.json`` to ``out_dir``.

    ``meta.json`` is ``meta`` (updated in place and returned) with what every prepared folder records of
    itself: ``rows`` and ``labels`` (:func:`label_summary`) per split, ``split_sha256`` (parquet file →
    hash, checked by :func:`read_split`), ``created`` (UTC, ISO 8601) and ``istar_version``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from istar.data.normalise import split_schema

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)
    for split in SPLITS:
        table = pa.Table.from_pandas(splits[split], schema=split_schema(task), preserve_index=False)
        with artifacts.atomic_path(out / f"{split}.parquet") as tmp, open(tmp, "wb") as handle:
            pq.write_table(table, handle)
    # split_sha256: the splits' content hashes, checked by read_split (a damaged parquet file is named, not misread)
    meta.update(rows={split: len(splits[split]) for split in SPLITS},
                labels={split: label_summary(splits[split], task) for split in SPLITS},
                split_sha256={f"{split}.parquet": artifacts.file_digest(out / f"{split}.parquet") for split in SPLITS},
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"), istar_version=__version__)
    artifacts.write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def label_summary(frame: pd.DataFrame, task: Task) -> dict:
    """Label counts (classification), score range (regression) or article count (qa)."""
    import numpy as np

    if task.kind == "classification":
        counts = np.bincount(frame["label"].to_numpy(), minlength=task.num_labels)
        return {"counts": {str(k): int(n) for k, n in enumerate(counts)}}
    if task.kind == "regression":
        scores = frame["label"].to_numpy(dtype=np.float64)
        if len(scores) == 0:
            return {"min": None, "max": None, "mean": None}
        return {"min": float(scores.min()), "max": float(scores.max()), "mean": round(float(scores.mean()), 6)}
    return {"articles": int(frame["title"].nunique())}


def _prepared_file(data_dir: str | Path, name: str) -> Path:
    """The file ``name`` of a prepared folder; a FileNotFoundError naming the command that writes it where it
    does not exist."""
    path = Path(data_dir) / name
    if not path.is_file():
        task = path.parent.name if path.parent.name in TASKS else "TASK"
        raise FileNotFoundError(f"{path} does not exist: run `istar prepare-data --task {task} --out {path.parent}` "
                                "first")
    return path


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """Read a split written by :func:`istar.data.prepare_task`.

    Parameters
    ----------
    data_dir : str or Path
        The folder given to :func:`istar.data.prepare_task` as ``out_dir``.
    split : {"train", "validation"}

    Returns
    -------
    frame : DataFrame
        The normalised columns (see :mod:`istar.registry.tasks`); SQuAD's ``answer_texts`` and
        ``answer_starts`` hold Python lists.
    """
    from istar.data.normalise import table_to_frame

    return table_to_frame(_read_table(data_dir, split))


def read_columns(data_dir: str | Path, split: str) -> dict[str, list]:
    """The split of :func:`read_split` as one Python list per column (no pandas): what the
    model steps tokenise (:func:`istar.data.encoding.encode_split`)."""
    return _read_table(data_dir, split).to_pydict()


def _read_table(data_dir: str | Path, split: str):
    """The split's arrow table, its file checked against ``meta.json``'s hash first."""
    import pyarrow.parquet as pq

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    path = _prepared_file(data_dir, f"{split}.parquet")
    artifacts.verify_artifact(path)  # against the hash in the meta.json beside it
    # ParquetFile, not pq.read_table: the latter goes through pyarrow.dataset, which imports pandas.
    return pq.ParquetFile(path).read()


def read_meta(data_dir: str | Path) -> dict:
    """The ``meta.json`` written by :func:`istar.data.prepare_task` (see its Returns for the keys); one that is
    not valid JSON raises :class:`istar.io.artifacts.DamagedArtifactError`."""
    return artifacts.read_json(_prepared_file(data_dir, "meta.json"))


def data_fingerprint(meta: dict) -> str:
    """The hash of a prepared folder's ``meta.json`` without its creation time (the same data prepared
    twice is the same data): the ``data`` entry of a run's fingerprint, which ``istar measure`` compares."""
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "created"}, sort_keys=True).encode()).hexdigest()
