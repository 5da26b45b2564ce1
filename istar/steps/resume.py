"""Resumable training states, and the fingerprint that decides whether a state may be resumed.

A run saves its accelerate state (model, optimizer, scheduler, RNGs, progress, Σ_S, log) as
``OUT/resume/state-{step}`` together with ``fingerprint.json``: every input that defines the
run's result (:func:`run_fingerprint`). A later start resumes the newest state only when the
fingerprint is unchanged; otherwise the state is discarded with one line naming what changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

from istar import __version__
from istar.io import artifacts
from istar.config.specs import TrainSpec
from istar.registry.methods import get_method

__all__ = ["run_fingerprint", "fingerprint_hash", "changed_settings", "latest_state", "matching_state", "save_state",
           "restore_log"]

# Settings that change neither the arithmetic nor the data order of a run: a state saved under
# other values of these is still the same run.
NOT_IN_FINGERPRINT = ("output_dir", "checkpoint_every", "mixed_precision")
# (mixed_precision is the precision asked for; the one that actually runs enters as "precision".)


def run_fingerprint(spec: TrainSpec, meta: dict, model_path: str, num_processes: int, precision: str) -> dict:
    """Everything that defines a run's result, as a flat dict (its hash is the run's fingerprint).

    The resolved settings, the prepared data (``meta.json``, which holds the splits' checksums),
    the Σ_S tensors, the model it starts from (the content of a local folder's files, or
    the hub id and revision), the process count (it sets the data order) and the effective precision.
    """
    model_dir = Path(model_path)
    model_files = ({p.name: artifacts.file_digest(p) for p in sorted(model_dir.iterdir()) if p.is_file()}
                   if model_dir.is_dir() else {"hub": model_path})
    settings = {k: v for k, v in dataclasses.asdict(spec).items() if k not in NOT_IN_FINGERPRINT}
    return {
        **{f"setting.{k}": v for k, v in settings.items()},
        # meta.json without its creation time: the same data prepared twice is the same data.
        "data": hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "created"},
                                          sort_keys=True).encode()).hexdigest(),
        # Σ_S by its tensors, not its file: the file's metadata also holds how long the step took.
        "sigma_s": (artifacts.tensor_digest(artifacts.load_tensors(spec.sigma_s)[0])
                    if spec.sigma_s and get_method(spec.method).takes("sigma_s") else None),
        **{f"model.{name}": digest for name, digest in model_files.items()},
        "num_processes": num_processes, "precision": precision, "istar_version": __version__,
    }


def fingerprint_hash(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def changed_settings(saved: dict, current: dict) -> list[str]:
    """Names of the fingerprint entries that differ (``setting.learning_rate``, ``data``, …)."""
    return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))


def latest_state(resume_dir: Path) -> Path | None:
    """The newest complete saved state (a folder with a COMPLETE marker), or None."""
    if not resume_dir.is_dir():
        return None
    complete = [p for p in resume_dir.glob("state-*") if (p / "COMPLETE").is_file()]
    return max(complete, key=lambda p: int(p.name.split("-")[1]), default=None)


def matching_state(resume_dir: Path, fingerprint: dict, print_fn=print) -> Path | None:
    """The newest saved state of this very run; states of a run with other settings are discarded.

    A state whose ``fingerprint.json`` differs from ``fingerprint`` (or has none) cannot be
    resumed without mixing two runs: it is removed, with one line naming what changed.
    """
    state = latest_state(resume_dir)
    if state is None:
        return None
    saved_path = state / "fingerprint.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    if saved == fingerprint:
        return state
    changed = changed_settings(saved, fingerprint) if saved else ["(the state has no fingerprint)"]
    shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
    print_fn(f"discarding the saved state in {resume_dir}: the run changed since it was saved ({shown}); starting afresh")
    for old in resume_dir.glob("state-*"):
        shutil.rmtree(old, ignore_errors=True)
    return None


def save_state(accelerator, resume_dir: Path, step: int, log_path: Path, fingerprint: dict) -> None:
    """Save the accelerate state atomically as ``state-{step}`` with the run's fingerprint; drop older states."""
    final = resume_dir / f"state-{step:08d}"
    staging = resume_dir / f".staging-{step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    if accelerator.is_main_process:
        if log_path.exists():
            shutil.copy2(log_path, staging / "train_log.csv")
        (staging / "fingerprint.json").write_text(json.dumps(fingerprint, sort_keys=True, indent=1))
        (staging / "COMPLETE").write_text(f"step {step}\n")
        artifacts.replace_directory(staging, final)
        for old in resume_dir.glob("state-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def restore_log(log_path: Path, state: Path | None) -> None:
    """Make the live log match the saved state: rows logged after it are dropped."""
    saved = state / "train_log.csv" if state is not None else None
    if saved is not None and saved.exists():
        shutil.copy2(saved, log_path)
    else:
        log_path.unlink(missing_ok=True)
