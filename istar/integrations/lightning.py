"""I-STAR in Lightning: :class:`IStarLightningCallback` serves the :class:`istar.IStarModel` a LightningModule trains.

::

    module = MyModule(IStarModel(model, IStarConfig(lam=-1.0, zeta=0.2), sigma_data=sigma_loader))
    lightning.Trainer(..., callbacks=[IStarLightningCallback()]).fit(module, loader)

Lightning is imported only here (``pip install "istar[lightning]"``).
"""

from __future__ import annotations

import lightning

from istar.integrations.wrapper import IStarModel

__all__ = ["IStarLightningCallback"]


class IStarLightningCallback(lightning.Callback):
    """Σ_S at each training epoch's start, and the penalty's logs after each training batch, for an :class:`IStarModel`.

    At each training epoch's start it calls :meth:`IStarModel.refresh_sigma` (every process takes part
    under DDP) and logs ``sigma_s_isoscore`` when Σ_S changed; after each training batch it logs the
    means of :meth:`IStarModel.pop_logs` (``task_loss``, ``istar_penalty``, ``isoscore_star``; averaged
    over processes) through the LightningModule's ``log_dict``, so they reach its logger.

    Parameters
    ----------
    target : IStarModel, optional
        The wrapped model; default: the one :class:`IStarModel` among the LightningModule's modules
        (itself, or an attribute such as ``self.model``).

    Examples
    --------
    >>> module = MyModule(IStarModel(model, IStarConfig(lam=-1.0), sigma_data=sigma_loader))   # doctest: +SKIP
    >>> lightning.Trainer(max_epochs=2, callbacks=[IStarLightningCallback()]).fit(module, loader)   # doctest: +SKIP
    """

    def __init__(self, target: IStarModel | None = None):
        self.target = target

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.target is None:
            found = [module for module in pl_module.modules() if isinstance(module, IStarModel)]
            if len(found) != 1:
                raise TypeError(f"IStarLightningCallback() found {len(found)} IStarModel in {type(pl_module).__name__}, "
                                "not one: train IStarModel(model, IStarConfig(...)) in the LightningModule, or name it, "
                                "IStarLightningCallback(wrapped)")
            self.target = found[0]
        score = self.target.refresh_sigma(trainer.current_epoch, progress=False)
        if score is not None:
            pl_module.log("sigma_s_isoscore", score, batch_size=1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        pl_module.log_dict(self.target.pop_logs(), batch_size=1)
