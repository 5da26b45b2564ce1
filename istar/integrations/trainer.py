"""I-STAR in a ``transformers.Trainer``: :class:`IStarTrainer`, or :class:`IStarTrainerMixin` beside another Trainer subclass.

::

    trainer = IStarTrainer(model=model, args=args, train_dataset=train, eval_dataset=validation,
                           data_collator=collator, compute_metrics=metrics,
                           istar=IStarConfig(lam=-1.0, zeta=0.2))
    trainer.train()

What it adds to the Trainer, and nothing else:

- **Σ_S** (:func:`istar.models.shrinkage.accumulate_shrinkage`) from the current model over the
  training set before training and, as in the paper, at the start of every later epoch
  (``recompute_every_epoch``); every process holds the same Σ_S (merged across processes).
  Its rows are the first ``sigma_rows`` of ``train_dataset`` in its order, read in batches of
  ``per_device_eval_batch_size`` through the Trainer's own evaluation loader (its collator and
  column removal), in a forked random state (:func:`istar.models.shrinkage.forked_rng`), so the
  training order and torch's random state are untouched: λ = 0 trains exactly as ζ = 0. Each
  checkpoint holds Σ_S and its epoch (``istar_sigma_s.pt``); a run resumed from it uses that Σ_S,
  so resuming ends on the uninterrupted run's parameters. The first batch's ``attention_mask`` is
  checked before the first Σ_S pass.
- **the penalty** λ·(1 − IsoScore*(X̃, ζ, Σ_S)) added to each training micro-batch's loss. The
  model is asked for its hidden states only in training: evaluation, ``predict`` and
  ``compute_metrics`` see the outputs they would without I-STAR.
- **gradient accumulation**: the loss of a micro-batch is its task loss (the model's mean over
  the micro-batch, as the paper's fine-tuning and ``istar train``) plus its penalty, divided by the
  number of micro-batches in the optimizer step, whatever the model's loss normalisation.
- **mixed precision**: the forward pass runs in the Trainer's precision; IsoScore* and its
  covariances are computed in float32/float64 (:func:`istar.core.isotropy.isoscore_star`).
- **logs**: ``task_loss``, ``istar_penalty`` (λ·(1 − IsoScore*), before the accumulation
  division) and ``isoscore_star``, means over the micro-batches since the last log averaged over
  processes, beside the Trainer's ``loss``; ``sigma_s_isoscore`` (IsoScore of Σ_S) at each refresh.
- **several processes** (``accelerate launch``, ``torchrun``): ``global_penalty=True`` penalises
  the IsoScore* of the global batch (:func:`istar.core.regularizers.global_istar_penalty`); in one
  process that is the local penalty, so one script runs both ways.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from istar.config.schema import default_of
from istar.core.isotropy import isoscore_star_from_covariance
from istar.core.regularizers import LayerSpec, global_istar_penalty, istar_penalty, resolve_layers
from istar.core.shrinkage import merge_layers
from istar.core.tokens import get_token_selection
from istar.models.shrinkage import accumulate_shrinkage, forked_rng

__all__ = ["IStarConfig", "IStarTrainerMixin", "IStarTrainer"]

LOG_KEYS = ("task_loss", "istar_penalty", "isoscore_star")


@dataclass(frozen=True)
class IStarConfig:
    """The I-STAR settings of a Trainer run; the defaults are the workflow's (its config schema).

    Attributes
    ----------
    lam : float
        λ; < 0 lowers isotropy (the paper's winning direction), > 0 raises it, 0 trains as the
        Trainer alone but still logs IsoScore* (a baseline to compare with).
    zeta : float
        ζ ∈ [0, 1], the weight of Σ_S in IsoScore*; 0 needs no Σ_S (none is computed).
    layers : str, int or list of int
        The hidden states the penalty reads (default ``"all"``: every transformer layer; see
        :data:`istar.core.regularizers.LayerSpec`).
    tokens : str
        ``"real"`` (the attention-masked tokens, the default) or ``"all_positions"`` (every
        padded position, as the authors' code).
    sigma_rows : int
        Σ_S's row budget, tokens × layers (default 250,000, as in the paper).
    recompute_every_epoch : bool
        Recompute Σ_S from the current model at each epoch's start (default True, as the paper).
    global_penalty : bool
        Under several processes, penalise the global batch's IsoScore* (default False, as the
        authors' code: each process its own batch).
    """

    lam: float
    zeta: float
    layers: LayerSpec = field(default_factory=lambda: default_of("penalty.layers"))
    tokens: str = field(default_factory=lambda: default_of("penalty.tokens"))
    sigma_rows: int = field(default_factory=lambda: default_of("shrinkage.rows"))
    recompute_every_epoch: bool = field(default_factory=lambda: default_of("shrinkage.recompute_every_epoch"))
    global_penalty: bool = field(default_factory=lambda: default_of("penalty.global_penalty"))

    def __post_init__(self):
        get_token_selection(self.tokens)
        if not 0.0 <= float(self.zeta) <= 1.0:
            raise ValueError(f"zeta must lie in [0, 1] (0 = no shrinkage, 1 = Σ_S alone); got {self.zeta}")


SIGMA_CHECKPOINT = "istar_sigma_s.pt"
"""The file in each Trainer checkpoint folder holding Σ_S and its epoch, so that a resumed run trains on."""


class _SigmaRefresh(TrainerCallback):
    """Σ_S before training and at the start of every later epoch (the Trainer's callbacks know when),
    and saved with every checkpoint."""

    def __init__(self, trainer: IStarTrainerMixin):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.start_sigma(int(state.epoch or 0))

    def on_epoch_begin(self, args, state, control, **kwargs):
        epoch = int(state.epoch or 0)
        if self.trainer.istar.recompute_every_epoch and epoch > self.trainer.sigma_epoch:
            self.trainer.refresh_sigma(epoch)

    def on_save(self, args, state, control, **kwargs):
        if args.should_save and self.trainer.sigma_s is not None:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            torch.save({"sigma_s": self.trainer.sigma_s.cpu(), "sigma_epoch": self.trainer.sigma_epoch},
                       folder / SIGMA_CHECKPOINT)


class IStarTrainerMixin:
    """The I-STAR penalty for any ``transformers.Trainer`` subclass (see the module docstring).

    ``class MyTrainer(IStarTrainerMixin, SomeTrainer)`` adds it to ``SomeTrainer``; the
    keyword argument ``istar`` (an :class:`IStarConfig`) is taken, the rest passed on.

    Attributes
    ----------
    sigma_s : the current Σ_S (d, d) on the training device (None before training or with ζ = 0).
    sigma_epoch : the epoch whose start Σ_S was computed at (−1 before the first).
    """

    # transformers.Trainer.training_step (where it knows this attribute) then leaves the loss of
    # compute_loss as it is: it is already divided for gradient accumulation here.
    loss_is_scaled_for_ga = True

    def __init__(self, *args, istar: IStarConfig, **kwargs):
        if not isinstance(istar, IStarConfig):
            raise TypeError(f"istar must be an IStarConfig (istar=IStarConfig(lam=..., zeta=...)); got {type(istar).__name__}")
        super().__init__(*args, **kwargs)
        self.istar = istar
        self.sigma_s: torch.Tensor | None = None
        self.sigma_epoch = -1
        self._istar_sums: dict[str, torch.Tensor] = {}
        self._istar_batches = 0
        self._resumed_from: Path | None = None
        self.add_callback(_SigmaRefresh(self))

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """The Trainer's ``train``; a run resumed from a checkpoint takes the Σ_S saved in it."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resumed_from = Path(resume_from_checkpoint) if resume_from_checkpoint else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def start_sigma(self, epoch: int) -> None:
        """Σ_S at the start of training: the checkpoint's when resuming, else computed (after checking a batch)."""
        saved = self._resumed_from / SIGMA_CHECKPOINT if self._resumed_from is not None else None
        if saved is not None and saved.is_file():
            state = torch.load(saved, map_location=self.args.device, weights_only=True)
            self.sigma_s, self.sigma_epoch = state["sigma_s"], int(state["sigma_epoch"])
            return
        with forked_rng(self.args.device):
            self._check_first_batch()
        self.refresh_sigma(epoch)

    def _check_first_batch(self) -> None:
        """The mask check of :meth:`compute_loss` on the first batch, before any Σ_S pass or step."""
        batch = next(iter(self.get_eval_dataloader(self.train_dataset)))
        if "attention_mask" not in batch and get_token_selection(self.istar.tokens).masked:
            raise ValueError(f"the training batches have no attention_mask (keys: {', '.join(batch)}): keep the "
                             "tokenizer's attention_mask in the dataset (and a collator such as "
                             "DataCollatorWithPadding), so that the penalty leaves padding out")

    def refresh_sigma(self, epoch: int) -> None:
        """Compute Σ_S from the current model over the training set (all processes take part).

        torch's random state is left as it was (:func:`istar.models.shrinkage.forked_rng`), so that a
        run at λ = 0 trains exactly as one without Σ_S.
        """
        self.sigma_epoch = epoch
        if float(self.istar.zeta) == 0.0:
            return
        if (get_token_selection(self.istar.tokens).sigma_uses_training_batches
                and self.args.per_device_eval_batch_size != self.args.per_device_train_batch_size):
            warnings.warn(f"tokens={self.istar.tokens!r} counts padding, so Σ_S should see batches like the "
                          f"training ones: set per_device_eval_batch_size = per_device_train_batch_size "
                          f"({self.args.per_device_train_batch_size}); Σ_S reads batches of "
                          f"{self.args.per_device_eval_batch_size}", stacklevel=2)
        model = self.accelerator.unwrap_model(self.model)
        with forked_rng(self.args.device):
            per_layer = accumulate_shrinkage(model, self.get_eval_dataloader(self.train_dataset), self.istar.layers,
                                             self.istar.sigma_rows, self.accelerator, tokens=self.istar.tokens,
                                             description=f"Σ_S at epoch {epoch + 1}",
                                             progress=not self.args.disable_tqdm)
        sigma = merge_layers(per_layer, resolve_layers(self.istar.layers, len(per_layer))).covariance()
        self.sigma_s = sigma.to(self.args.device)
        self.log({"sigma_s_isoscore": float(isoscore_star_from_covariance(sigma, 0.0))})

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:  # evaluation and prediction: exactly the Trainer's outputs
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        # The task loss as each micro-batch's mean (num_items_in_batch not passed on), so that task
        # loss and penalty are scaled alike below, whatever the model does with num_items_in_batch.
        task_loss, outputs = super().compute_loss(model, {**inputs, "output_hidden_states": True}, return_outputs=True)
        hidden_states = outputs.get("hidden_states") if isinstance(outputs, dict) else None
        if hidden_states is None:
            raise ValueError("the model returned no hidden_states although the Trainer asked for them: I-STAR needs a "
                             "Hugging Face model whose forward takes output_hidden_states=True and returns a ModelOutput")
        penalty_fn = global_istar_penalty if self.istar.global_penalty else istar_penalty
        penalty = penalty_fn(hidden_states, inputs.get("attention_mask"), lam=self.istar.lam, zeta=self.istar.zeta,
                             sigma_s=self.sigma_s, layers=self.istar.layers, tokens=self.istar.tokens)
        self._add_to_logs(task_loss, penalty)
        loss = (task_loss + penalty.term) / self._accumulation_divisor(num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _accumulation_divisor(self, num_items_in_batch) -> int:
        """What this loss is divided by here: the micro-batches of the optimizer step, unless the Trainer divides.

        Trainers that know ``loss_is_scaled_for_ga`` (set True below) never divide a loss from here;
        older ones divide unless the model takes loss kwargs and got ``num_items_in_batch``.
        """
        steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        if hasattr(Trainer, "loss_is_scaled_for_ga"):
            return steps
        trainer_divides = not (getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None)
        return 1 if trainer_divides else steps

    def _add_to_logs(self, task_loss: torch.Tensor, penalty) -> None:
        values = {"task_loss": task_loss, "istar_penalty": penalty.term, "isoscore_star": penalty.logs["isoscore_star"]}
        for key, value in values.items():  # summed on the device: no synchronisation per micro-batch
            self._istar_sums[key] = self._istar_sums.get(key, 0.0) + value.detach().float()
        self._istar_batches += 1

    def log(self, logs: dict, *args, **kwargs) -> None:
        """The Trainer's log, with the I-STAR means since the last training log (every process calls this)."""
        if "loss" in logs and self._istar_batches:
            means = torch.stack([self._istar_sums[key] for key in LOG_KEYS]) / self._istar_batches
            if self.accelerator.num_processes > 1:
                means = self.accelerator.reduce(means, reduction="mean")
            logs = {**logs, **dict(zip(LOG_KEYS, means.tolist()))}
            self._istar_sums, self._istar_batches = {}, 0
        super().log(logs, *args, **kwargs)


class IStarTrainer(IStarTrainerMixin, Trainer):
    """``transformers.Trainer`` with the I-STAR penalty (see :mod:`istar.integrations.trainer`).

    Takes the Trainer's arguments and ``istar=IStarConfig(lam=..., zeta=...)``.
    """
