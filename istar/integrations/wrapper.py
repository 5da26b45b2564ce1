"""I-STAR on the model itself: :class:`IStarModel` adds the penalty to ``outputs.loss`` inside ``forward``.

For training code you do not subclass — a ``transformers.Trainer`` that a framework builds for you, a
plain accelerate loop, a Lightning module — wrap the model, and refresh Σ_S at each epoch's start
(:class:`IStarCallback` does it in a Trainer, :class:`istar.integrations.lightning.IStarLightningCallback`
in Lightning; elsewhere call :meth:`IStarModel.refresh_sigma`)::

    model = IStarModel(model, IStarConfig(lam=-1.0, zeta=0.2), sigma_data=sigma_loader)
    trainer = Trainer(model=model, ..., callbacks=[IStarCallback()])

In training mode, ``forward`` calls the wrapped model with ``output_hidden_states=True`` and
returns its outputs with ``loss`` = task loss + the penalty of the batch (the paper's Eq. 2 for
I-STAR: λ·(1 − IsoScore*(X̃, ζ, Σ_S))), read from the hidden states and the ``attention_mask``
the call was given. In evaluation mode it is the wrapped model's forward, untouched. The wrapper is
the wrapped model itself seen through a subclass of its class: the same parameters, state dict keys,
``config``, ``save_pretrained`` (a peft model's adapter folder), ``generate`` and type checks, so a
Trainer saves, resumes and loads it as the model it wraps.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from istar.integrations.config import ISTAR_SETTINGS, IStarConfig, IStarHolder, check_mask, penalty_logs
from istar.models.shrinkage import forked_rng

__all__ = ["IStarModel", "IStarCallback", "penalty_share", "ISTAR_SETTINGS"]


def penalty_share(labels: torch.Tensor | None, num_items_in_batch, shifted: bool = False) -> torch.Tensor | float:
    """The weight of a micro-batch's penalty when the task loss is a sum over an accumulated step's tokens.

    A caller that passes ``num_items_in_batch`` to the model (a Trainer never does: see
    ``IStarModel.accepts_loss_kwargs``) normalises the task loss by the label tokens of the whole
    optimizer step and does not divide by the accumulation steps; the penalty of each micro-batch is
    then weighted by its share of those tokens, n_k / N, so that the step's penalty is the
    token-weighted mean of its micro-batches'.

    Parameters
    ----------
    labels : (B, T) tensor of the micro-batch's labels (−100 = ignored), or None.
    num_items_in_batch : N, the label tokens of the optimizer step (None: no such normalisation).
    shifted : count ``labels[..., 1:]`` (a causal LM's loss predicts the next token).

    Returns
    -------
    n_k / N as a 0-d tensor, or 1.0 when the Trainer normalises per micro-batch.
    """
    if num_items_in_batch is None or labels is None:
        return 1.0
    counted = labels[..., 1:] if shifted else labels
    return counted.ne(-100).sum() / torch.as_tensor(num_items_in_batch, device=labels.device).clamp_min(1)


class IStarModel(IStarHolder, torch.nn.Module):
    """A Hugging Face model whose training ``forward`` adds the I-STAR (or CosReg) penalty to ``outputs.loss``.

    ``IStarModel(model, ...)`` returns ``model`` itself seen through a subclass of its class (named as
    it, with its ``forward``'s signature): one set of parameters and attributes, the same state dict keys,
    ``isinstance(wrapped, type(model))``. ``model`` keeps its own class and behaviour; it also holds
    the settings below (one I-STAR setting per model at a time).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Called with keyword tensors (``input_ids``, ``attention_mask`` (B, T), ``labels``), returning
        a ``ModelOutput`` with ``loss`` and, when asked, ``hidden_states`` (L + 1 tensors (B, T, d)).
    istar : IStarConfig
        The method, λ, ζ and the source of Σ_S.
    sigma_data : iterable of dict, optional
        The batches Σ_S is computed over at each epoch's start (:meth:`refresh_sigma`): a
        ``DataLoader`` of tokenised batches with ``input_ids`` and ``attention_mask`` — the training
        set without shuffling, say (the training loader itself would move its sampler's random
        state). Needed only when Σ_S is computed (I-STAR with ζ > 0 and no fixed ``sigma_s``).

    Attributes
    ----------
    istar : IStarConfig
        The settings given.

    Notes
    -----
    **Loss normalisation.** The penalty is one value per forward call (micro-batch), added to the
    micro-batch's task loss, and whoever divides the loss by the accumulation steps divides both
    alike: a plain loop, and a ``Trainer``, which (``accepts_loss_kwargs = False``) passes no
    ``num_items_in_batch`` and divides. A caller that passes ``num_items_in_batch`` itself (the task
    loss a sum over the step's tokens divided by their count) gets the penalty weighted by the
    micro-batch's share of those tokens (:func:`penalty_share`).

    **Saving.** :meth:`save_pretrained` (which a ``Trainer``'s checkpoints and ``save_model`` call) writes
    the wrapped model's own folder — ``config.json`` and its weights (tied weights once), or a peft
    model's adapter folder — that ``from_pretrained`` (``PeftModel.from_pretrained``) loads, and
    :data:`ISTAR_SETTINGS` beside it.

    **Labels.** A ``Trainer`` reads the label names from the class's ``forward`` signature, which
    names ``labels``; for other targets (``start_positions``, …) set ``TrainingArguments(label_names=…)``.

    Examples
    --------
    >>> model = IStarModel(model, IStarConfig(lam=-1.0, zeta=0.2), sigma_data=sigma_loader)   # doctest: +SKIP
    >>> for epoch in range(epochs):                                                          # doctest: +SKIP
    ...     model.refresh_sigma(epoch)
    ...     for batch in loader:
    ...         model(**batch).loss.backward()
    """

    # A transformers.Trainer reads this before the forward's signature (which, copied from the wrapped model,
    # takes **kwargs): it then passes no num_items_in_batch and divides each micro-batch's loss by the
    # accumulation steps, so the task loss (each micro-batch's mean) and the penalty are scaled alike, across
    # processes too, as in IStarTrainer, whatever the wrapped model's loss does with num_items_in_batch.
    accepts_loss_kwargs = False

    def __new__(cls, model, istar: IStarConfig, sigma_data=None):
        parameters = inspect.signature(model.forward).parameters.values()
        if not any(p.name == "output_hidden_states" or p.kind is p.VAR_KEYWORD for p in parameters):
            raise TypeError(f"{type(model).__name__}.forward takes no output_hidden_states, which IStarModel passes to "
                            "read the hidden states: wrap a Hugging Face model (AutoModelFor...), or add the penalty in "
                            "your own loop with istar.istar_penalty(hidden_states, attention_mask, lam=..., ...)")
        base = type(model).__bases__[1] if isinstance(model, IStarModel) else type(model)
        wrapped = object.__new__(_penalised(base))
        wrapped.__dict__ = model.__dict__  # one state: parameters, hooks, config and training mode are the model's
        return wrapped

    def __init__(self, model, istar: IStarConfig, sigma_data=None):  # torch's Module.__init__ would empty the state
        self._hold(istar, "IStarModel(model, IStarConfig(lam=..., zeta=...))")
        self.sigma_data = sigma_data

    def __reduce_ex__(self, protocol):
        # copy.deepcopy and pickle rebuild the run-time subclass from the wrapped model's class, an importable one
        return _rebuilt, (type(self).__bases__[1],), self.__dict__

    def refresh_sigma(self, epoch: int, accelerator=None, progress: bool = True) -> float | None:
        """Σ_S for the start of ``epoch`` (0-based): the given one or one computed over ``sigma_data`` at the first,
        recomputed at later ones with ``recompute_shrinkage``, else kept; torch's random state left alone.

        Call it at every epoch's start on every process (a no-op when nothing is due). The first
        batch's ``attention_mask`` is checked before the first pass.

        Parameters
        ----------
        epoch : int
            The epoch about to start, from 0.
        accelerator : accelerate.Accelerator, optional
            Autocast and the merge of Σ_S across processes (``sigma_data`` prepared by it is sharded).
        progress : bool
            Show a progress bar over the batches.

        Returns
        -------
        float or None
            IsoScore of the new Σ_S (to log as ``sigma_s_isoscore``), None when none was set.
        """
        first = self.sigma_epoch < 0
        given = first and self.istar.sigma_s is not None
        computed = self._schedule.due(epoch) and self.istar.needs_sigma_s and not given
        if computed and self.sigma_data is None:
            raise ValueError("Σ_S is computed from the model but no data was given: IStarModel(model, istar, "
                             "sigma_data=DataLoader(train, batch_size=32, collate_fn=collator)), or a fixed "
                             "IStarConfig(sigma_s=..., recompute_shrinkage=False)")
        if computed and first:
            with forked_rng(next(self.parameters()).device):
                check_mask(next(iter(self.sigma_data)), self.istar, "the Σ_S batches")
        return self._schedule.update(epoch, self, self.sigma_data, accelerator, progress=progress,
                                     computed_from="the model over sigma_data")

    def forward(self, *args, labels=None, **kwargs):
        """The wrapped model's forward; in training, with the penalty added to ``outputs.loss``.

        Parameters
        ----------
        *args, **kwargs : the wrapped model's inputs; ``attention_mask`` (B, T) must be a keyword.
        labels : the wrapped model's ``labels`` (passed on as given).

        Returns
        -------
        The wrapped model's ``ModelOutput``; in training, ``loss`` = task loss + share · penalty and,
        when the method adds a penalty, ``hidden_states`` (L + 1 tensors (B, T, d)).
        """
        if labels is not None:
            kwargs["labels"] = labels
        model_forward = super().forward  # the wrapped model's class's
        if not self.training or not self.istar.entry.penalises:
            return model_forward(*args, **kwargs)
        check_mask(kwargs, self.istar, "the model's inputs")
        if self.istar.needs_sigma_s and self.sigma_s is None:
            raise ValueError("no Σ_S yet: call refresh_sigma(epoch) at each epoch's start (a Trainer: "
                             "callbacks=[IStarCallback()]), or use zeta=0")
        outputs = model_forward(*args, **{**kwargs, "output_hidden_states": True})
        hidden_states = outputs.get("hidden_states") if isinstance(outputs, dict) else None
        if hidden_states is None or outputs.get("loss") is None:
            raise ValueError("the model returned no loss or no hidden_states: IStarModel needs a Hugging Face model "
                             "that takes labels and output_hidden_states=True and returns a ModelOutput")
        penalty = self.istar.penalty(hidden_states, kwargs.get("attention_mask"), self.sigma_s)
        self._istar_logs.add(penalty_logs(self.istar, outputs.loss, penalty))
        share = penalty_share(kwargs.get("labels"), kwargs.get("num_items_in_batch"), shifted=self._shifts_labels())
        outputs["loss"] = outputs.loss + share * penalty.term
        return outputs

    def _shifts_labels(self) -> bool:
        """Whether the wrapped model's loss predicts the next token (the Trainer counts ``labels[..., 1:]`` then)."""
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

        config = getattr(self, "config", None)
        return (LOSS_MAPPING.get(getattr(self, "loss_type", None)) is ForCausalLMLoss
                and not getattr(config, "is_encoder_decoder", False))

    def pop_logs(self, accelerator=None) -> dict[str, float]:
        """The means since the last call of ``task_loss``, ``istar_penalty`` and ``isoscore_star`` (CosReg:
        ``cosreg_penalty``, ``cosine_similarity``) over the training forwards, averaged over the processes
        (``accelerator``'s, or an initialised ``torch.distributed`` group's: call it on every process); empty
        when none ran."""
        return self._istar_logs.pop(accelerator)

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs) -> None:
        """The wrapped model's ``save_pretrained`` (a peft model's: its adapter folder), and
        :data:`istar.integrations.config.ISTAR_SETTINGS` (:meth:`save_settings`: the settings and where Σ_S came
        from: the model over ``sigma_data``, a tensor given, or the file's path)."""
        super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
        if is_main_process:
            self.save_settings(save_directory)


def _rebuilt(base: type) -> IStarModel:
    """An empty :class:`IStarModel` of ``base``, whose state ``copy`` and ``pickle`` then set."""
    return object.__new__(_penalised(base))


@functools.cache
def _penalised(base: type) -> type:
    """``base`` with :class:`IStarModel`'s training forward: named as ``base`` (``config.json``'s ``architectures``)
    and with ``base.forward``'s signature (a Trainer keeps the dataset columns and finds the labels it names)."""
    def forward(self, *args, **kwargs):
        return IStarModel.forward(self, *args, **kwargs)

    return type(base.__name__, (IStarModel, base), {"forward": functools.update_wrapper(forward, base.forward),
                                                     "__module__": __name__})


class IStarCallback(TrainerCallback):
    """Σ_S for a ``transformers.Trainer`` you do not subclass: refreshed at training's and each epoch's start.

    The penalty's means (:meth:`IStarModel.pop_logs`, averaged over processes) and, after each refresh,
    ``sigma_s_isoscore`` (IsoScore of Σ_S) join the next training log: ``trainer.state.log_history``,
    the console and every tracker (``report_to`` included: at training's start this callback moves
    itself to the head of the Trainer's callbacks, ahead of the trackers the Trainer lists first).

    Parameters
    ----------
    target : IStarModel or istar.IStarLoss, optional
        Whatever holds the penalty: something with ``refresh_sigma(epoch)`` and ``pop_logs()``. Default:
        the Trainer's model, which is then the :class:`IStarModel`; an ``IStarLoss`` is named here.

    Examples
    --------
    >>> model = IStarModel(model, IStarConfig(lam=-1.0), sigma_data=sigma_loader)       # doctest: +SKIP
    >>> Trainer(model=model, args=args, train_dataset=train, callbacks=[IStarCallback()])  # doctest: +SKIP
    """

    def __init__(self, target=None):
        self.target = target
        self._pending: dict[str, float] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.target is None:
            if not hasattr(model, "refresh_sigma"):
                raise TypeError(f"IStarCallback() found a {type(model).__name__} as the Trainer's model, not an "
                                "IStarModel: train IStarModel(model, IStarConfig(...)), or name what holds the penalty, "
                                "IStarCallback(loss) for an IStarLoss")
            self.target = model
        _move_to_the_head(self)
        self.on_epoch_begin(args, state, control)

    def on_epoch_begin(self, args, state, control, **kwargs):
        score = self.target.refresh_sigma(int(state.epoch or 0), progress=not args.disable_tqdm)
        if score is not None:
            self._pending["sigma_s_isoscore"] = score

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            means = {**self.target.pop_logs(), **self._pending}
            self._pending = {}
            logs.update(means)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(means)


def _move_to_the_head(callback: TrainerCallback) -> None:
    """Put ``callback`` first in the list of the Trainer's ``CallbackHandler`` that is calling it.

    The values a callback adds to a log reach only the callbacks after it, and a Trainer lists its
    ``report_to`` trackers before the callbacks it is given; it hands callbacks no handle on its
    list, so the handler is found as the caller of this event. The handler's loop over its list
    moves on from the next callback, as before the move.
    """
    frame = sys._getframe(1)
    while frame is not None and not isinstance(frame.f_locals.get("self"), CallbackHandler):
        frame = frame.f_back
    if frame is not None:
        callbacks = frame.f_locals["self"].callbacks
        callbacks.insert(0, callbacks.pop(callbacks.index(callback)))
