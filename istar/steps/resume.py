"""Resumable training states, and the fingerprint that decides whether a state may be resumed.

A run saves its accelerate state (model, optimizer, scheduler, RNGs, progress, Σ_S, log) as
``OUT/resume/state-{step}`` together with ``fingerprint.json``: every input that defines the
run's result (:func:`run_fingerprint`). A later start resumes the newest state only when the
fingerprint is unchanged; otherwise the state is discarded with one line naming what changed.
Each state also records the sha256 of its files (``digests.json``), checked before it is
loaded: a damaged state is discarded with one line, and the run falls back to an older
complete state or starts afresh.

SIGTERM and SIGINT during training (:class:`StopRequest`) are acted on at the next optimizer
step boundary: a state is saved there and :class:`Interrupted` says where and how to resume.
:class:`Progress` is the run's own part of every state (epoch, step, Σ_S, history).

The disk space those states, the final model and the Σ_S copies need is checked before the first
step (:func:`check_free_space`), so that a full disk stops a run at its start rather than at a
state's save hours later.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from istar import __version__
from istar.config.specs import TrainSpec
from istar.data.storage import data_fingerprint
from istar.io import artifacts
from istar.registry.methods import get_method

if TYPE_CHECKING:
    import torch

__all__ = ["STATES_AT_ONCE", "run_fingerprint", "fingerprint_hash", "latest_state", "matching_state", "save_state",
           "load_state", "restore_log", "saved_tracking", "StopRequest", "Interrupted", "Progress", "space_needed",
           "check_free_space"]


@dataclass
class Progress:
    """Training progress, saved and restored with the accelerate state (``register_for_checkpointing``)."""

    epoch: int = 0
    batches_in_epoch: int = 0
    step: int = 0
    sigma_epoch: int = -1
    sigma_s: torch.Tensor | None = None
    history: list = field(default_factory=list)
    sigma_isoscore: list = field(default_factory=list)  # IsoScore(Σ_S) after 0, 1, … epochs

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)

# Settings that change neither the arithmetic nor the data order of a run: a state saved under
# other values of these is still the same run.
NOT_IN_FINGERPRINT = ("output_dir", "checkpoint_every", "mixed_precision", "trackers", "mlflow_tracking_uri",
                      "tracking_experiment")
# (mixed_precision is the precision asked for; the one that actually runs enters as "precision".
# Where a run's curves are shown, and the code's provenance (git commit), are not part of it:
# a new commit or another tracker must not invalidate finished runs or resume states.)


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
        "data": data_fingerprint(meta),
        # Σ_S by its tensors, not its file: the file's metadata also holds how long the step took.
        "sigma_s": (artifacts.tensor_digest(artifacts.load_tensors(spec.sigma_s)[0])
                    if spec.sigma_s and get_method(spec.method).takes("sigma_s") else None),
        **{f"model.{name}": digest for name, digest in model_files.items()},
        "num_processes": num_processes, "precision": precision, "istar_version": __version__,
    }


def fingerprint_hash(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


STATES_AT_ONCE = 2
"""Saved states on disk at once, at most: :func:`save_state` writes the new one beside the newest
and removes the older one only when the new one is complete (so a run keeps one between saves)."""


def space_needed(spec: TrainSpec, model) -> dict[str, int]:
    """What a run writes into its folder at most, in bytes, estimated from the model's weights (count and
    dtype): ``state`` (one resume state), ``model`` (the final model), ``sigma_copy`` (one Σ_S copy,
    ``sigma_epoch{e}.pt``), ``copies`` (how many: I-STAR's) and ``total`` (all of them at the fullest moment)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    d, hidden_states = model.config.hidden_size, model.config.num_hidden_layers + 1
    copies = ((1 + (spec.epochs - 1 if spec.recompute_shrinkage else 0))
              if get_method(spec.method).needs_sigma_s(spec.zeta) else 0)
    # a state: the weights, AdamW's two moments (each in its weight's dtype), the current Σ_S (float64);
    # a state and the final model also hold small files (RNG states, progress, log; the tokenizer)
    small = 1 << 20
    state, final_model = 3 * weights + (8 * d * d if copies else 0) + small, weights + small
    # save_shrinkage: Σ_S and its mean, and every hidden state's count, mean and sums of products (float64)
    sigma_copy = 8 * (d * d + d + hidden_states * (1 + d + d * d))
    # STATES_AT_ONCE while a state replaces the last; the final model is written beside the last state
    total = state + max((STATES_AT_ONCE - 1) * state, final_model) + copies * sigma_copy
    return {"state": state, "model": final_model, "sigma_copy": sigma_copy, "copies": copies, "total": total}


def check_free_space(spec: TrainSpec, model, out: Path, resume_dir: Path) -> None:
    """Before the first step: room on the run folder ``out``'s disk for :func:`space_needed`, less what
    the folder holds of it already (a state to resume from in ``resume_dir``, earlier Σ_S copies).
    Raises :class:`istar.io.artifacts.NotEnoughSpaceError` saying how much is missing."""
    need = space_needed(spec, model)
    held = sum(p.stat().st_size for state in resume_dir.glob("state-*") for p in state.rglob("*") if p.is_file()) \
        + sum(p.stat().st_size for p in out.glob("sigma_epoch*.pt"))
    size, copies = artifacts.format_bytes, need["copies"]
    what = (f"training writes resume states of about {size(need['state'])} each ({STATES_AT_ONCE} at once while one "
            f"replaces the other) and the final model ({size(need['model'])}) beside the last one"
            + (f", and {copies} Σ_S cop{'y' if copies == 1 else 'ies'} of {size(need['sigma_copy'])}" if copies else "")
            + f": {size(need['total'])} at most")
    artifacts.check_free_space(out, need["total"] - held, what, "no training step was taken")



def complete_states(resume_dir: Path) -> list[Path]:
    """The complete saved states (folders with a COMPLETE marker), newest first."""
    if not resume_dir.is_dir():
        return []
    complete = [p for p in resume_dir.glob("state-*") if (p / "COMPLETE").is_file()]
    return sorted(complete, key=lambda p: int(p.name.split("-")[1]), reverse=True)


def latest_state(resume_dir: Path) -> Path | None:
    """The newest complete saved state, or None."""
    return next(iter(complete_states(resume_dir)), None)


def _intact(state: Path, print_fn) -> bool:
    """Whether ``state``'s files match the hashes recorded when it was saved; a damaged state is
    removed, with one line naming it."""
    try:
        artifacts.verify_digests(state)  # (a state saved before states recorded digests is not checked)
        return True
    except artifacts.DamagedArtifactError as error:
        problem = f"{error.path.name}: {error.problem}"
    older = [p for p in complete_states(state.parent) if p != state]
    then = f"falling back to {older[0].name}" if older else "starting afresh"
    print_fn(f"discarding the damaged saved state {state} ({problem}); {then} (`--restart` starts afresh without "
             "reading saved states)")
    shutil.rmtree(state, ignore_errors=True)
    return False


def matching_state(resume_dir: Path, fingerprint: dict, print_fn=print) -> Path | None:
    """The newest intact saved state of this very run; damaged states and states of a run with
    other settings are discarded.

    A state whose files differ from its ``digests.json`` is removed with one line, and the next
    older complete state is tried. A state whose ``fingerprint.json`` differs from ``fingerprint``
    (or has none) cannot be resumed without mixing two runs: it is removed, with one line naming
    what changed.
    """
    state = next((s for s in complete_states(resume_dir) if _intact(s, print_fn)), None)
    if state is None:
        return None
    saved_path = state / "fingerprint.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    if saved == fingerprint:
        return state
    # the names of the entries that differ (setting.learning_rate, data, …)
    changed = (sorted(key for key in saved.keys() | fingerprint.keys() if saved.get(key) != fingerprint.get(key))
               if saved else ["(the state has no fingerprint)"])
    shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
    print_fn(f"discarding the saved state in {resume_dir}: the run changed since it was saved ({shown}); starting afresh")
    for old in resume_dir.glob("state-*"):
        shutil.rmtree(old, ignore_errors=True)
    return None


def save_state(accelerator, resume_dir: Path, step: int, log_path: Path, fingerprint: dict,
               tracking: dict | None = None) -> None:
    """Save the accelerate state atomically as ``state-{step}`` with the run's fingerprint and the
    hashes of its files; drop older states.

    ``tracking`` (:meth:`istar.steps.tracking.Tracking.state`: the tracker run ids) is kept as
    ``tracking.json`` so that a resumed run continues the same tracker runs.

    A full disk raises :class:`istar.io.artifacts.OutOfSpaceError` naming the state and the one
    kept (the previous state stays until the new one is complete; the partial one is removed).
    """
    final = resume_dir / f"state-{step:08d}"
    staging = resume_dir / f".staging-{step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    previous = latest_state(resume_dir)
    kept = (f"the previous state {previous} is kept, and the same command resumes from it" if previous is not None
            else "no state was saved before, so the run will start afresh")
    try:
        with artifacts.storage_errors(final, kept):
            accelerator.save_state(str(staging))
            if accelerator.is_main_process:
                if log_path.exists():
                    shutil.copy2(log_path, staging / "train_log.csv")
                (staging / "fingerprint.json").write_text(json.dumps(fingerprint, sort_keys=True, indent=1))
                (staging / "tracking.json").write_text(json.dumps(tracking or {}, sort_keys=True))
                artifacts.record_digests(staging)  # checked before the state is loaded again
                (staging / "COMPLETE").write_text(f"step {step}\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if accelerator.is_main_process:
        artifacts.replace_directory(staging, final)
        for old in resume_dir.glob("state-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def load_state(accelerator, state: Path) -> None:
    """Load ``state`` into the accelerator's objects; one that cannot be loaded stops the run, naming the fix."""
    try:
        accelerator.load_state(str(state))
    except Exception as error:
        # The model may be half overwritten by now: this process cannot start afresh by itself.
        raise ValueError(f"the saved state {state} cannot be loaded ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}): run the same command with `--restart` "
                         f"to start this run afresh (or remove {state.parent})") from None


def saved_tracking(state: Path | None) -> dict:
    """The tracker run ids a saved state kept (empty for a fresh start or a state saved without trackers)."""
    path = state / "tracking.json" if state is not None else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def restore_log(log_path: Path, state: Path | None) -> None:
    """Make the live log match the saved state: rows logged after it are dropped."""
    saved = state / "train_log.csv" if state is not None else None
    if saved is not None and saved.exists():
        shutil.copy2(saved, log_path)
    else:
        log_path.unlink(missing_ok=True)


class Interrupted(Exception):
    """Training stopped by a signal after saving its state; ``signum`` gives the exit status 128 + signum."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """SIGTERM and SIGINT while the block runs are remembered, not acted on at once: the training
    loop asks :meth:`requested` at each optimizer step boundary, saves a state and stops there.

    (SLURM sends SIGTERM and waits a grace period before SIGKILL; a terminal's Ctrl-C sends
    SIGINT.) A repeated signal does not stop the save — several processes of one job often get
    the same signal twice (from the scheduler and from a launcher forwarding it); SIGKILL stops
    at once, losing the steps since the last saved state.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # (only it may set handlers)
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, signum, frame) -> None:
        # os.write, not print: a handler may run in the middle of another write to stderr.
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            os.write(2, f"\n{name} received: saving a resume state at the end of this optimizer step, then "
                        "stopping (SIGKILL stops at once, losing the steps since the last saved state)\n".encode())
        else:
            os.write(2, f"\n{name} received again: already stopping after saving a resume state\n".encode())

    def requested(self, accelerator) -> int | None:
        """The signal to stop for, agreed by every process (each may have received it, or not)."""
        if accelerator.num_processes == 1:
            return self.signum
        import torch

        received = accelerator.gather(torch.tensor([self.signum or 0], device=accelerator.device))
        return int(received.max().item()) or None
