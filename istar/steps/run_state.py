"""What one fine-tuning run holds while it trains: :class:`TrainingRun`, read by the loop
(:mod:`istar.steps.train`, which builds it), its outputs (:mod:`istar.steps.train_outputs`) and its
Σ_S (:mod:`istar.steps.sigma_tracking`, through :class:`istar.steps.resume.Progress`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from istar.steps.resume import save_state

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from istar.config.specs import TrainSpec
    from istar.data.encoding import Features
    from istar.steps.common import ModelContext
    from istar.steps.resume import Progress
    from istar.steps.tracking import Tracking

__all__ = ["TrainingRun"]


@dataclass
class TrainingRun:
    """Everything one run holds while it trains, built once by :func:`istar.steps.train.prepare` (its
    settings are in ``spec``): the model context, the model, optimizer, scheduler and loaders prepared by
    accelerate, the progress saved with every state (Σ_S's included) and the Σ_S the penalty reads."""

    spec: TrainSpec
    context: ModelContext  # accelerator, task, tokenizer, data meta, model source
    out: Path
    resume_dir: Path
    tracking: Tracking
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader
    eval_loader: DataLoader
    train_features: Features
    eval_features: Features
    eval_columns: dict[str, list]
    progress: Progress
    fingerprint: dict
    total_steps: int
    forward: Callable  # the step's forward and losses, compiled as training.compile asks (istar.steps.train_step)
    penalty_sigma: torch.Tensor | None = None  # the Σ_S the penalty reads, on the device (istar.steps.sigma_tracking)

    @property
    def accelerator(self) -> Accelerator:
        return self.context.accelerator

    @property
    def log_path(self) -> Path:
        return self.resume_dir / "train_log.csv"

    def save_state(self) -> None:
        """A resumable state at the current optimizer step; the trackers hold every point up to it first."""
        self.tracking.commit()
        save_state(self.accelerator, self.resume_dir, self.progress.step, self.log_path, self.fingerprint,
                   self.tracking.state())
