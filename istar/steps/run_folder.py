"""A run folder's finished outputs: what binds them together, how they are cleared, how they are read.

``istar train`` writes, once a run is done (:mod:`istar.steps.train`)::

    OUT/model/            the fine-tuned model, with digests.json (file → sha256)
    OUT/train_log.csv
    OUT/run_config.json   settings and provenance, with its content hash (key sha256)
    OUT/metrics.json      last: the completion mark, with its content hash and model_sha256,
                          the sha256 of model/digests.json (the model these metrics belong to)

Every later step that trusts these files reads them through :func:`read_finished_run`, which
refuses a changed file (content hash), a ``model/`` of another run (``model_sha256``), and a
folder that also holds a saved training state (``resume/``): a training of the folder is then
running or was interrupted, and its outputs would be mixed with the finished run's.
Before training starts, :func:`clear_earlier_outputs` removes the finished outputs of an
earlier run of the folder (another setting, or the same one trained again).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from istar.io import artifacts
from istar.steps.tracking import tracking_dir

__all__ = ["METRICS", "RUN_CONFIG", "MODEL", "TRAIN_LOG", "model_sha256", "clear_earlier_outputs",
           "read_finished_run"]

METRICS, RUN_CONFIG, MODEL, TRAIN_LOG = "metrics.json", "run_config.json", "model", "train_log.csv"


def model_sha256(model_dir) -> str:
    """sha256 of a saved model folder's ``digests.json``: one hash for every file of the model."""
    return artifacts.file_digest(Path(model_dir) / artifacts.DIGESTS)


def clear_earlier_outputs(out, resuming: bool, print_fn=print) -> list[str]:
    """Remove the finished outputs of an earlier run from ``out`` before training starts.

    ``metrics.json`` goes first (it marks a folder as finished), then ``run_config.json``,
    ``train_log.csv`` and ``model/``; a fresh start (``resuming`` False) also removes the
    ``sigma_epoch{e}.pt`` files and the tracker files under ``tracking/``, which a resumed run
    keeps as its own. One line names what
    was removed. Returns the removed names.
    """
    out = Path(out)
    stale = [out / name for name in (METRICS, RUN_CONFIG, TRAIN_LOG, MODEL) if (out / name).exists()]
    if not resuming:
        stale += sorted(out.glob("sigma_epoch*.pt")) + [p for p in (tracking_dir(out),) if p.exists()]
    for path in stale:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    names = [path.name + ("/" if path.suffix == "" else "") for path in stale]
    finished = [name for name in names if not name.startswith(("sigma_epoch", tracking_dir(out).name))]
    if finished:
        print_fn(f"removed the outputs of an earlier run from {out} ({', '.join(finished)}) before training")
    return names


def _rebuild(run_dir: Path) -> str:
    return f"train it again (`snakemake --forcerun {run_dir / METRICS}`, or `istar train … --out {run_dir}`)"


def read_finished_run(run_dir) -> tuple[dict, dict]:
    """``(metrics, run_config)`` of a finished run folder, after checking that they belong together.

    Raises ``ValueError`` (:class:`istar.io.artifacts.DamagedArtifactError` for a changed file)
    naming the folder, the problem and the fix, when ``metrics.json`` or ``run_config.json``
    is missing, changed or has no content hash, when ``model/`` is not the model the metrics
    were measured on, or when the folder holds a saved training state.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    metrics_path, config_path = run_dir / METRICS, run_dir / RUN_CONFIG
    if not metrics_path.is_file():
        raise ValueError(f"run folder {run_dir} has no {METRICS}: {METRICS} is written last, so the run did not "
                         "finish (rerun or resume it)")
    if not config_path.is_file():
        raise ValueError(f"run folder {run_dir} has {METRICS} but no {RUN_CONFIG}: the run folder is incomplete; "
                         + _rebuild(run_dir))
    metrics = artifacts.read_json(metrics_path, metrics_path)
    config = artifacts.read_json(config_path, metrics_path)
    for path, data in ((metrics_path, metrics), (config_path, config)):
        if not isinstance(data, dict) or "sha256" not in data:
            raise artifacts.DamagedArtifactError(path, "it carries no content hash: written by an older istar, "
                                                       "or rewritten by hand", metrics_path)
    states = sorted(p.name for p in (run_dir / "resume").glob("state-*")) if (run_dir / "resume").is_dir() else []
    if states:
        raise ValueError(f"run folder {run_dir} holds a saved training state (resume/{states[-1]}) beside the outputs "
                         f"of a finished run: a training of this folder is running or was interrupted, possibly with "
                         f"other settings; finish it (run the same `istar train` again) or remove {run_dir / 'resume'}")
    if metrics.get("fingerprint") != config.get("fingerprint"):
        raise ValueError(f"run folder {run_dir} mixes two runs: {METRICS} (fingerprint {metrics.get('fingerprint')}) "
                         f"and {RUN_CONFIG} ({config.get('fingerprint')}); " + _rebuild(run_dir))
    model_dir = run_dir / MODEL
    if model_dir.is_dir():
        recorded = metrics.get("model_sha256")
        actual = model_sha256(model_dir) if (model_dir / artifacts.DIGESTS).is_file() else None
        if recorded is None or actual != recorded:
            raise ValueError(f"run folder {run_dir} mixes two runs: {model_dir} is not the model {METRICS} was "
                             "measured on (its digests.json differs from the model_sha256 recorded there); "
                             + _rebuild(run_dir))
    return metrics, config
