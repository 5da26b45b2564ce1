"""I-STAR in a ``transformers.Trainer``: :class:`IStarTrainer`, or :class:`IStarTrainerMixin` beside another Trainer subclass.

::

    trainer = IStarTrainer(model=model, args=args, train_dataset=train, eval_dataset=validation,
                           data_collator=collator, compute_metrics=metrics,
                           istar=IStarConfig(lam=-1.0, zeta=0.2))
    trainer.train()

The method, λ, ζ and where Σ_S comes from are the :class:`istar.integrations.config.IStarConfig`'s
(CosReg: ``IStarConfig(method="cosreg")``; a fixed or file Σ_S: ``sigma_s=...,
recompute_shrinkage=False``).

What it adds to the Trainer, and nothing else:

- **Σ_S** (:func:`istar.models.shrinkage.shrinkage_covariance`) from the current model over the
  training set before training (unless ``IStarConfig.sigma_s`` gives it) and, as in the paper, at
  the start of every later epoch (``recompute_shrinkage``); every process holds the same Σ_S (merged across processes).
  Its rows are the first ``shrinkage_rows`` of ``train_dataset`` in its order, read in batches of
  ``per_device_eval_batch_size`` through the Trainer's own evaluation loader (its collator and
  column removal), in a forked random state (:func:`istar.models.shrinkage.forked_rng`), so the
  training order and torch's random state are untouched: λ = 0 trains exactly as ζ = 0. Each
  checkpoint holds Σ_S and its epoch (``istar_sigma_s.pt``); a run resumed from it uses that Σ_S,
  so resuming ends on the uninterrupted run's parameters. Each checkpoint and ``save_model`` folder also
  holds ``istar_config.json`` (:meth:`istar.integrations.config.IStarHolder.save_settings`): the settings
  and where the Σ_S in use came from. The first batch's ``attention_mask`` is
  checked before the first Σ_S pass.
- **the penalty** of the configured method (I-STAR: λ·(1 − IsoScore*(X̃, ζ, Σ_S)), Eq. 2) added to each training micro-batch's loss. The
  model is asked for its hidden states only in training: evaluation, ``predict`` and
  ``compute_metrics`` see the outputs they would without I-STAR.
- **gradient accumulation**: the loss of a micro-batch is its task loss (the model's mean over
  the micro-batch, as the paper's fine-tuning and ``istar train``) plus its penalty, divided by the
  number of micro-batches in the optimizer step, whatever the model's loss normalisation.
- **mixed precision**: the forward pass runs in the Trainer's precision; IsoScore* and its
  covariances are computed in float32/float64 (:func:`istar.core.isotropy.isoscore_star`).
- **logs**: ``task_loss``, ``istar_penalty`` (λ·(1 − IsoScore*), before the accumulation
  division) and ``isoscore_star`` (CosReg: ``cosreg_penalty``, ``cosine_similarity``), means over the micro-batches since the last log averaged over
  processes, beside the Trainer's ``loss``; ``sigma_s_isoscore`` (IsoScore of Σ_S) at each refresh.
- **several processes** (``accelerate launch``, ``torchrun``): ``global_penalty=True`` penalises
  the IsoScore* of the global batch (:func:`istar.core.regularizers.global_istar_penalty`); in one
  process that is the local penalty, so one script runs both ways.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from istar.core.tokens import get_token_selection
from istar.integrations.config import IStarConfig, IStarHolder, check_mask, penalty_logs
from istar.models.shrinkage import forked_rng

__all__ = ["IStarTrainerMixin", "IStarTrainer", "SIGMA_CHECKPOINT"]

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
        self.trainer.refresh_sigma(int(state.epoch or 0))

    def on_save(self, args, state, control, **kwargs):
        if args.should_save and self.trainer.sigma_s is not None:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            torch.save({"sigma_s": self.trainer.sigma_s.cpu(), "sigma_epoch": self.trainer.sigma_epoch},
                       folder / SIGMA_CHECKPOINT)


class IStarTrainerMixin(IStarHolder):
    """The I-STAR penalty for any ``transformers.Trainer`` subclass (see the module docstring).

    ``class MyTrainer(IStarTrainerMixin, SomeTrainer)`` adds it to ``SomeTrainer``; the
    keyword argument ``istar`` (an :class:`istar.integrations.config.IStarConfig`) is taken, the
    rest passed on. The model must be a Hugging Face model called with keyword tensors
    (``input_ids``, ``attention_mask``) that returns a ``ModelOutput``; a SentenceTransformer
    takes a features dict instead.

    Attributes
    ----------
    sigma_s : torch.Tensor or None
        The current Σ_S (d, d) float64 on the training device (None before training or with ζ = 0).
    sigma_epoch : int
        The epoch whose start Σ_S was computed at (−1 before the first).

    Examples
    --------
    >>> class MySFTTrainer(IStarTrainerMixin, SFTTrainer):   # doctest: +SKIP
    ...     pass
    >>> MySFTTrainer(model=model, args=args, train_dataset=data, istar=IStarConfig(lam=-1.0))   # doctest: +SKIP

    Parameters
    ----------
    *args, **kwargs
        The Trainer's own arguments, passed on.
    istar : IStarConfig
        Keyword only: the method, λ, ζ and the source of Σ_S.
    """

    # transformers.Trainer.training_step (where it knows this attribute) then leaves the loss of
    # compute_loss as it is: it is already divided for gradient accumulation here.
    loss_is_scaled_for_ga = True

    def __init__(self, *args, istar: IStarConfig, **kwargs):
        self._hold(istar, "istar=IStarConfig(lam=..., zeta=...)")
        super().__init__(*args, **kwargs)
        self._resumed_from: Path | None = None
        self.add_callback(_SigmaRefresh(self))

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """The Trainer's ``train``; a run resumed from a checkpoint takes the Σ_S saved in it."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resumed_from = Path(resume_from_checkpoint) if resume_from_checkpoint else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def start_sigma(self, epoch: int) -> None:
        """Σ_S at the start of training: the checkpoint's when resuming, else the given or computed one.

        The first batch's mask is checked (:func:`istar.integrations.config.check_mask`) before any Σ_S pass.
        """
        saved = self._resumed_from / SIGMA_CHECKPOINT if self._resumed_from is not None else None
        if saved is not None and saved.is_file():
            state = torch.load(saved, map_location=self.args.device, weights_only=True)
            self._schedule.sigma_s, self._schedule.sigma_epoch = state["sigma_s"], int(state["sigma_epoch"])
            self._schedule.source = str(saved)
            return
        with forked_rng(self.args.device):
            check_mask(next(iter(self.get_eval_dataloader(self.train_dataset))), self.istar)
        self.refresh_sigma(epoch)

    def refresh_sigma(self, epoch: int) -> None:
        """Σ_S for the start of ``epoch`` (:class:`istar.integrations.config.SigmaSchedule`): given, computed from
        the current model over the training set (all processes take part), or kept.

        torch's random state is left as it was (:func:`istar.models.shrinkage.forked_rng`), so that a
        run at λ = 0 trains exactly as one without Σ_S.
        """
        if (self._schedule.due(epoch) and self.istar.needs_sigma_s
                and get_token_selection(self.istar.tokens).sigma_uses_training_batches
                and self.args.per_device_eval_batch_size != self.args.per_device_train_batch_size):
            warnings.warn(f"tokens={self.istar.tokens!r} counts padding, so Σ_S should see batches like the "
                          f"training ones: set per_device_eval_batch_size = per_device_train_batch_size "
                          f"({self.args.per_device_train_batch_size}); Σ_S reads batches of "
                          f"{self.args.per_device_eval_batch_size}", stacklevel=2)
        score = self._schedule.update(epoch, self.accelerator.unwrap_model(self.model),
                                      self.get_eval_dataloader(self.train_dataset), self.accelerator,
                                      progress=not self.args.disable_tqdm, computed_from="the model over train_dataset")
        if score is not None:
            self._schedule.sigma_s = self._schedule.sigma_s.to(self.args.device)
            self.log({"sigma_s_isoscore": score})

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's ``save_model`` (each checkpoint's too), with ``istar_config.json`` beside the weights."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            self.save_settings(output_dir or self.args.output_dir)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:  # evaluation and prediction: exactly the Trainer's outputs
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        penalised = self.istar.entry.penalises
        # The hidden states are read where the backbone returns them (a forward hook), not from the
        # outputs compute_loss returns: a Trainer may compute its loss from other outputs (TRL's
        # SFTTrainer, from its fused LM head's log-probabilities) and rebuild those it returns
        # without gradients.
        captured = []
        backbone = getattr(self.accelerator.unwrap_model(model), "base_model", None)
        hook = (backbone.register_forward_hook(lambda module, args, output: captured.append(output))
                if penalised and isinstance(backbone, torch.nn.Module) else None)
        try:
            # The task loss as each micro-batch's mean (num_items_in_batch not passed on), so that task
            # loss and penalty are scaled alike below, whatever the model does with num_items_in_batch.
            result = super().compute_loss(model, {**inputs, "output_hidden_states": True} if penalised else inputs,
                                          return_outputs=return_outputs)
        finally:
            if hook is not None:
                hook.remove()
        task_loss, outputs = result if return_outputs else (result, None)
        penalty = self._penalty(captured, inputs) if penalised else None
        self._istar_logs.add(penalty_logs(self.istar, task_loss, penalty))
        # divided by the optimizer step's micro-batches here: the Trainer does not (loss_is_scaled_for_ga above)
        steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        loss = (task_loss if penalty is None else task_loss + penalty.term) / steps
        return (loss, outputs) if return_outputs else loss

    def _penalty(self, captured: list, inputs):
        """The penalty of the first backbone output in ``captured`` that holds hidden states."""
        hidden_states = next((output["hidden_states"] for output in captured
                              if isinstance(output, dict) and output.get("hidden_states") is not None), None)
        if hidden_states is None:
            raise ValueError("the model returned no hidden_states although the Trainer asked for them: I-STAR needs a "
                             "Hugging Face model whose forward takes output_hidden_states=True and returns a ModelOutput")
        return self.istar.penalty(hidden_states, inputs.get("attention_mask"), self.sigma_s)

    def log(self, logs: dict, *args, **kwargs) -> None:
        """The Trainer's log, with the penalty's means since the last training log (every process calls this)."""
        if "loss" in logs:
            logs = {**logs, **self._istar_logs.pop(self.accelerator)}
        super().log(logs, *args, **kwargs)


class IStarTrainer(IStarTrainerMixin, Trainer):
    """``transformers.Trainer`` with the I-STAR penalty (see :mod:`istar.integrations.trainer`).

    Takes the Trainer's arguments and ``istar=IStarConfig(lam=..., zeta=...)``.

    Examples
    --------
    >>> trainer = IStarTrainer(model=model, args=args, train_dataset=train, data_collator=collator,
    ...                        istar=IStarConfig(lam=-1.0, zeta=0.2))   # doctest: +SKIP
    >>> trainer.train()   # doctest: +SKIP

    Parameters
    ----------
    *args, **kwargs
        ``transformers.Trainer``'s arguments (``model``, ``args``, ``train_dataset``, ``data_collator``, …).
    istar : IStarConfig
        Keyword only: the method, λ, ζ and the source of Σ_S.
    """
