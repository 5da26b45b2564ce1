"""Atomic file output: write to a temporary name in the same folder, then rename.

A job killed half-way leaves either the old file or none, never a truncated one, so
Snakemake and DVC never mistake a partial output for a finished one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_json", "write_text", "torch_save", "replace_directory"]


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs should be as readable as any file
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:  # on disk before the rename, so a crash cannot leave it empty
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def torch_save(path, obj) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def replace_directory(staging, final) -> None:
    """Move a fully written ``staging`` folder to ``final``, replacing what was there."""
    staging, final = Path(staging), Path(final)
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)
