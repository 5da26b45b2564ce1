"""Before a fine-tuning run starts: the finished outputs of an earlier run of its folder are cleared
(:func:`clear_earlier_outputs`), so a reused folder never mixes two runs. What those outputs are,
and how every later step reads them with their hashes, is :mod:`istar.io.results`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from istar.io.results import METRICS, MODEL, RUN_CONFIG, TRAIN_LOG
from istar.steps.tracking import tracking_dir

__all__ = ["clear_earlier_outputs"]


def clear_earlier_outputs(out, resuming: bool, print_fn=print) -> None:
    """Remove the finished outputs of an earlier run from ``out`` before training starts.

    ``metrics.json`` goes first (it marks a folder as finished), then ``run_config.json``,
    ``train_log.csv`` and ``model/``, in one line naming them; a fresh start (``resuming`` False) also
    removes, without a line, the ``sigma_epoch{e}.pt`` files and the tracker files under ``tracking/``,
    which a resumed run keeps as its own.
    """
    out = Path(out)
    finished = [out / name for name in (METRICS, RUN_CONFIG, TRAIN_LOG, MODEL) if (out / name).exists()]
    own = [] if resuming else sorted(out.glob("sigma_epoch*.pt")) + [p for p in (tracking_dir(out),) if p.exists()]
    for path in finished + own:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if finished:
        print_fn(f"removed the outputs of an earlier run from {out} "
                 f"({', '.join(path.name + ('/' if path.suffix == '' else '') for path in finished)}) before training")
