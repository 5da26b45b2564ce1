"""Live training curves through accelerate's trackers: TensorBoard, DVCLive, MLflow.

``tracking.trackers`` in the config (``TrainSpec.trackers``) lists the trackers a run logs
to; accelerate creates them (``Accelerator(log_with=…)``, ``init_trackers``) and, as for
everything accelerate logs, only the main process writes. A run logs, at optimizer step t:

    train/loss, train/task_loss, train/penalty, train/isoscore_star,
    train/cosine_similarity, train/lr                     every ``log_every`` steps (train_log.csv's rows)
    eval/{metric}, sigma_s_isoscore, epoch                at each epoch end (t = the epoch's last step)
    sigma_s_isoscore                                      at t = 0 (Σ_S of the model before training)

and its settings (the TrainSpec) and provenance as parameters. Files stay in the run folder:
``OUT/tracking/tensorboard/{experiment}/`` (event files) and ``OUT/tracking/dvclive/`` (DVCLive's metric
TSVs under ``plots/metrics/``, ``metrics.json``, ``params.yaml``; ``dvc plots show`` renders the
TSVs). DVCLive creates no DVC experiment (``save_dvc_exp=False``): Snakemake runs many
fine-tuning jobs at once in one checkout, and each experiment would be a git commit of that
checkout taken under DVC's repository lock. Nor does it write a ``dvc.yaml`` (``dvcyaml=False``):
run folders lie inside ``results/runs``, an output of the project's DVC stage, where DVC refuses
another stage file; the run folders, tracker files included, are shared through DVC as outputs.

**Resume.** A resumed run continues the same tracker runs: MLflow's run id is kept in every
saved state (``tracking.json``, :meth:`Tracking.state`); TensorBoard and DVCLive continue in
their folder. Steps logged after the saved state and before the kill are replayed by the
resumed run, so each tracker is rolled back to the state first: TensorBoard hides the events
after it (``purge_step``), DVCLive's metric files are cut after it, and MLflow, whose points
cannot be removed, is not sent a step it already holds (a resumed run recomputes the same
values). The curve therefore has every step once. Trackers that buffer (TensorBoard) are
flushed before every saved state, so nothing up to a state can be lost with the process.

**A tracker that fails.** An MLflow server that cannot be reached when the run starts stops it
before training, in one line (:class:`TrackerUnavailableError`). A tracker that fails later
(the server went away) gets a warning; training goes on, the points it missed are kept and
sent again at every saved state and at the end, and ``train_log.csv`` has them all anyway.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["TRACKERS", "Tracking", "TrackerUnavailableError", "tracking_dir"]


class TrackerUnavailableError(ConnectionError):
    """A tracker's server cannot be reached before training starts; the message names the fix."""


def tracking_dir(output_dir) -> Path:
    """Where a run's tracker files live: ``OUT/tracking``."""
    return Path(output_dir) / "tracking"


@dataclass(frozen=True)
class RunContext:
    """What a tracker needs to know about the run it logs."""

    out: Path                 # the run folder, as given: also the run's name in the tracker
    resume_step: int | None   # the step of the state being resumed; None on a fresh start
    saved: dict               # what the resumed state recorded about this tracker (its run id)
    mlflow_tracking_uri: str | None


@dataclass(frozen=True)
class TrackerKind:
    """How the run uses one of accelerate's trackers.

    ``init_kwargs`` are passed to accelerate's tracker class; ``check`` runs on every process
    before anything is trained (a server answers); ``rollback`` runs on the main process before
    the tracker starts (files cut back to the resumed step); ``logged_steps`` gives, per
    key, the last step the tracker already holds (points it cannot forget are not re-sent);
    ``run_id`` is what the resume state keeps; ``flush`` writes buffered points to disk.
    """

    key: str
    init_kwargs: Callable[[RunContext], dict]
    check: Callable[[RunContext], None] = lambda context: None
    rollback: Callable[[RunContext], None] = lambda context: None
    logged_steps: Callable[[RunContext], dict] = lambda context: {}
    run_id: Callable[[object], dict] = lambda tracker: {}
    flush: Callable[[object], None] = lambda tracker: None


# ----------------------------------------------------------------------------------- DVCLive

def _dvclive_dir(context: RunContext) -> Path:
    return tracking_dir(context.out) / "dvclive"


def _dvclive_rollback(context: RunContext) -> None:
    """Cut DVCLive's metric files (``plots/metrics/**.tsv``: timestamp, step, value) after the resumed step,
    and drop its summary (``metrics.json``, the latest values).

    The summary describes a step past the state, and DVCLive rewrites it in place at every step, so a
    run killed at the wrong moment leaves it empty and DVCLive's resume fails on it; the resumed run
    writes it again at its first step.
    """
    if context.resume_step is None:
        return
    (_dvclive_dir(context) / "metrics.json").unlink(missing_ok=True)
    for path in (_dvclive_dir(context) / "plots" / "metrics").rglob("*.tsv"):
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if not rows:
            continue
        kept = [row for row in rows if int(row["step"]) <= context.resume_step]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t")
            writer.writeheader()
            writer.writerows(kept)


# ----------------------------------------------------------------------------------- MLflow

def _mlflow_check(context: RunContext) -> None:
    """Point the client at the server and check that it answers (one line naming the fix if not)."""
    import mlflow

    uri = context.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise TrackerUnavailableError(
            "tracker mlflow needs a tracking server: set tracking.mlflow_tracking_uri in the config "
            "(--mlflow-tracking-uri) or MLFLOW_TRACKING_URI, e.g. http://127.0.0.1:5000")
    # A server that went away must not stall training for minutes: few retries, short timeouts
    # (unless the user set them).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    mlflow.set_tracking_uri(uri)
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as answer:
                answer.read()
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TrackerUnavailableError(
                f"the MLflow tracking server {uri} cannot be reached ({reason}); start it "
                f"(mlflow server --host 127.0.0.1 --port PORT), fix tracking.mlflow_tracking_uri, or "
                f"remove mlflow from tracking.trackers") from None


def _mlflow_logged_steps(context: RunContext) -> dict:
    """The last step of every metric the resumed MLflow run holds already."""
    run_id = context.saved.get("run_id")
    if context.resume_step is None or not run_id:
        return {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    return {key: max(point.step for point in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics}


TRACKERS: dict[str, TrackerKind] = {kind.key: kind for kind in (
    # purge_step: events at steps after the resumed state (a killed run's last rows) are hidden by
    # TensorBoard's readers; the resumed run writes them again.
    TrackerKind("tensorboard", lambda context: {} if context.resume_step is None else {"purge_step": context.resume_step + 1},
                flush=lambda tracker: tracker.writer.flush()),
    TrackerKind("dvclive", lambda context: {"dir": str(_dvclive_dir(context)), "resume": context.resume_step is not None,
                                            "save_dvc_exp": False, "dvcyaml": False}, rollback=_dvclive_rollback),
    TrackerKind("mlflow", lambda context: {"run_id": context.saved.get("run_id"), "run_name": str(context.out),
                                           "logging_dir": None},
                check=_mlflow_check, logged_steps=_mlflow_logged_steps,
                run_id=lambda tracker: {"run_id": tracker.active_run.info.run_id}),
)}


class Tracking:
    """The trackers of one run (main process; on the other processes every method does nothing).

    Use::

        tracking = Tracking(spec)                    # before the Accelerator: .log_with, .project_dir
        tracking.preflight()                         # every process: servers answer
        tracking.start(accelerator, resume_step, saved)
        tracking.log(values, step) … tracking.commit() before each saved state … tracking.finish()
    """

    def __init__(self, spec):
        """``spec``: the run's TrainSpec (its trackers, run folder, experiment and MLflow server; its settings
        are the trackers' parameters)."""
        self.spec = spec
        # (names are those of TRACKERS: TrainSpec.validate checks them against the schema's list)
        self.kinds = [TRACKERS[name] for name in spec.trackers]
        self.out = Path(spec.output_dir)
        self.log_with = [kind.key for kind in self.kinds]  # accelerate's names of the trackers
        # accelerate's logging directory: TensorBoard writes to OUT/tracking/tensorboard/{experiment}
        self.project_dir = str(tracking_dir(self.out) / "tensorboard")
        self.trackers: dict = {}     # name → accelerate tracker (main process)
        self.logged: dict = {}       # name → {key: last step the tracker already holds}
        self.pending: dict = {}      # name → [(values, step)] not yet accepted by a failing tracker
        self.warned: set = set()     # trackers that failed (one warning each)

    def preflight(self) -> None:
        """Check each tracker's server before anything is trained (raises :class:`TrackerUnavailableError`)."""
        for kind in self.kinds:
            kind.check(RunContext(self.out, None, {}, self.spec.mlflow_tracking_uri))

    def start(self, accelerator, resume_step: int | None, saved: dict) -> None:
        """Start the trackers (accelerate's ``init_trackers``), continuing the resumed runs (``saved``:
        what the state being resumed kept, :meth:`state`).

        The run's parameters, every setting of its spec and where its code came from, are stored
        only on a fresh start (the resumed runs have them).
        """
        if not self.kinds:
            return
        contexts = {kind: RunContext(self.out, resume_step, saved.get(kind.key, {}), self.spec.mlflow_tracking_uri)
                    for kind in self.kinds}
        if accelerator.is_main_process:
            for kind, context in contexts.items():
                kind.rollback(context)
        config = None
        if resume_step is None:
            from istar.io.provenance import code_provenance

            provenance = {f"provenance.{key}": value for key, value in code_provenance().items()}
            # as tracker parameters: numbers, strings and booleans as they are, the rest as text
            config = {key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
                      for key, value in {**dataclasses.asdict(self.spec), **provenance}.items()}
        # the project name is MLflow's experiment and TensorBoard's folder under project_dir
        accelerator.init_trackers(self.spec.tracking_experiment, config=config,
                                  init_kwargs={kind.key: kind.init_kwargs(context) for kind, context in contexts.items()})
        if accelerator.is_main_process:
            self.trackers = {kind.key: accelerator.get_tracker(kind.key) for kind in self.kinds}
            self.logged = {kind.key: kind.logged_steps(context) for kind, context in contexts.items()}

    def state(self) -> dict:
        """What a saved state keeps to continue the same tracker runs (MLflow's run id)."""
        states = {name: TRACKERS[name].run_id(tracker) for name, tracker in self.trackers.items()}
        return {name: state for name, state in states.items() if state}

    def log(self, values: dict, step: int) -> None:
        """Log ``values`` (name → number) at optimizer step ``step`` to every tracker.

        What ``accelerator.log`` does, tracker by tracker, so that one failing tracker does
        not keep the others from their points.
        """
        # numbers only: a log row also holds empty cells and text (which tokens the penalty read)
        values = {key: float(value) for key, value in values.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool)}
        for name in self.trackers:
            new = {key: value for key, value in values.items() if step > self.logged[name].get(key, -1)}
            if new:
                self.pending.setdefault(name, []).append((new, step))
                if len(self.pending[name]) == 1:  # a tracker with a backlog is retried at commit() only
                    self._send(name)

    def _send(self, name: str) -> bool:
        """Send a tracker its pending points; on failure keep them and warn once."""
        queue = self.pending.get(name, [])
        while queue:
            values, step = queue[0]
            try:
                self.trackers[name].log(values, step=step)
            except Exception as error:  # a remote tracker can fail in many ways; training must go on
                if name not in self.warned:
                    self.warned.add(name)
                    warnings.warn(f"tracker {name} failed at step {step} ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0] if str(error) else ''}); training goes on, the points "
                                  f"are kept and sent again at the next saved state, and train_log.csv has them all",
                                  RuntimeWarning, stacklevel=2)
                return False
            queue.pop(0)
        return True

    def commit(self) -> None:
        """Before a state is saved: send backlogs and flush buffered points to disk."""
        for name, tracker in self.trackers.items():
            if self._send(name):
                try:
                    TRACKERS[name].flush(tracker)
                except Exception as error:
                    warnings.warn(f"tracker {name} could not flush ({error})", RuntimeWarning, stacklevel=2)

    def finish(self) -> None:
        """End the tracker runs (accelerate's ``end_training``), after a last try to send any backlog."""
        unsent = []
        for name, tracker in self.trackers.items():
            if not self._send(name):
                unsent.append(f"{name} ({len(self.pending[name])} logging steps)")
            try:
                tracker.finish()
            except Exception as error:
                warnings.warn(f"tracker {name} could not end its run ({type(error).__name__})", RuntimeWarning,
                              stacklevel=2)
        if unsent:
            warnings.warn(f"points not delivered to {', '.join(unsent)}; train_log.csv and metrics.json in "
                          f"{self.out} hold the complete curves", RuntimeWarning, stacklevel=2)
        self.trackers = {}
