"""I-STAR in sentence-transformers: :class:`IStarLoss`, a loss that wraps yours, as ``MatryoshkaLoss`` does.

::

    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer import losses

    loss = IStarLoss(model, losses.MultipleNegativesRankingLoss(model), IStarConfig(lam=-1.0, zeta=0.2),
                     sigma_data=train_dataset["anchor"])
    trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss,
                                         callbacks=[IStarCallback(loss)])

The wrapped loss runs as it would; meanwhile the token embeddings of every layer and the
attention mask of each forward pass of the model's ``Transformer`` module are read (as
``AdaptiveLayerLoss`` reads them), and the penalty of their union is added: I-STAR's
λ·(1 − IsoScore*(X̃, ζ, Σ_S)) (the paper's Eq. 2) or CosReg's. Σ_S is computed over
``sigma_data`` (texts, tokenised by the model's tokenizer) at training's and each epoch's start
by :class:`istar.integrations.wrapper.IStarCallback`. sentence-transformers is imported only here
(``pip install istar[sentence-transformers]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from istar.integrations.config import IStarConfig, IStarHolder, penalty_logs
from istar.models.shrinkage import text_batches

__all__ = ["IStarLoss", "union_of_batches"]


def union_of_batches(captured: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]):
    """The hidden states and masks of several forward passes as one padded batch.

    Parameters
    ----------
    captured : list of (hidden_states, attention_mask): L + 1 tensors (B_i, T_i, d) and (B_i, T_i).

    Returns
    -------
    (hidden_states, attention_mask): L + 1 tensors (ΣB_i, max T_i, d) and (ΣB_i, max T_i), the
    added positions masked out (0).
    """
    if len(captured) == 1:
        return captured[0]
    width = max(mask.shape[1] for _, mask in captured)
    masks = torch.cat([F.pad(mask, (0, width - mask.shape[1])) for _, mask in captured])
    states = tuple(torch.cat([F.pad(states[layer], (0, 0, 0, width - states[layer].shape[1])) for states, _ in captured])
                   for layer in range(len(captured[0][0])))
    return states, masks


class IStarLoss(IStarHolder, torch.nn.Module):
    """A sentence-transformers loss plus the I-STAR (or CosReg) penalty of all layers' token embeddings.

    Parameters
    ----------
    model : sentence_transformers.SentenceTransformer
        Its first module a ``Transformer`` (a Hugging Face encoder with hidden states).
    loss : torch.nn.Module
        Your sentence-transformers loss (``MultipleNegativesRankingLoss(model)``, ``CoSENTLoss(model)``,
        …); not a cached (GradCache) one, whose forward passes run without gradients.
    istar : IStarConfig
        The method, λ, ζ and the source of Σ_S.
    sigma_data : sequence of str, optional
        The texts Σ_S is computed over (a column of the training set, say); needed when Σ_S is
        computed (I-STAR with ζ > 0 and no fixed ``sigma_s``).
    batch_size : int
        Texts per forward pass of the Σ_S pass.

    Returns
    -------
    Called by the trainer with ``(features, labels)``: a dict of 0-d tensors, ``task_loss`` (or the
    wrapped loss's own components) and ``istar_penalty`` (CosReg: ``cosreg_penalty``), which
    ``SentenceTransformerTrainer`` sums and logs one by one. In evaluation, the wrapped loss alone.

    Examples
    --------
    >>> loss = IStarLoss(model, losses.MultipleNegativesRankingLoss(model), IStarConfig(lam=-1.0),
    ...                  sigma_data=train["anchor"])                                       # doctest: +SKIP
    >>> SentenceTransformerTrainer(model=model, train_dataset=train, loss=loss,
    ...                            callbacks=[IStarCallback(loss)]).train()                 # doctest: +SKIP
    """

    def __init__(self, model, loss: torch.nn.Module, istar: IStarConfig, sigma_data=None, batch_size: int = 32):
        from sentence_transformers.base.losses.gradcache import uses_gradient_cache
        from sentence_transformers.base.modules import Transformer

        if not isinstance(model[0], Transformer):
            raise ValueError(f"IStarLoss reads the token embeddings of the model's first module, a Transformer; "
                             f"this model's is {type(model[0]).__name__}")
        if uses_gradient_cache(loss):
            raise ValueError(f"{type(loss).__name__} embeds without gradients (GradCache), so no penalty can reach "
                             "the model: wrap its uncached form (MultipleNegativesRankingLoss, …)")
        super().__init__()
        self._hold(istar, "IStarLoss(model, loss, IStarConfig(lam=..., zeta=...))")
        self.model = model
        self.loss = loss
        self.sigma_data = sigma_data
        self.batch_size = batch_size

    def _transformer(self):
        return getattr(self.model, "module", self.model)[0]  # the trainer may put a DDP wrapper in its place

    def refresh_sigma(self, epoch: int, accelerator=None, progress: bool = True) -> float | None:
        """Σ_S for the start of ``epoch`` over ``sigma_data`` (see :class:`istar.integrations.config.SigmaSchedule`).

        Returns IsoScore of the new Σ_S, or None when none was set.
        """
        transformer = self._transformer()
        computed = (self._schedule.due(epoch) and self.istar.needs_sigma_s
                    and not (self._schedule.sigma_epoch < 0 and self.istar.sigma_s is not None))
        if computed and self.sigma_data is None:
            raise ValueError("Σ_S is computed from the model but no texts were given: IStarLoss(model, loss, istar, "
                             "sigma_data=train_dataset['anchor']), or a fixed IStarConfig(sigma_s=..., "
                             "recompute_shrinkage=False)")
        batches = text_batches(self.sigma_data, transformer.tokenizer, self.batch_size, transformer.max_seq_length or 512,
                               accelerator) if computed else None
        return self._schedule.update(epoch, transformer.auto_model, batches, accelerator, progress=progress)

    def pop_logs(self, accelerator=None) -> dict[str, float]:
        """The means since the last call of the penalty's measures (``isoscore_star`` or ``cosine_similarity``)."""
        return {key: value for key, value in self._istar_logs.pop(accelerator).items()
                if not key.endswith(("_loss", "_penalty"))}

    def forward(self, sentence_features, labels):
        model = getattr(self.model, "module", self.model)
        swapped = vars(model).get("forward")
        if swapped is not None and getattr(swapped, "__self__", None) is not model:
            # MatryoshkaLoss and AdaptiveLayerLoss swap the model's forward for one that calls this loss again
            # on cached embeddings (they put the model's own bound forward back afterwards, which is no swap),
            # where no hidden states pass and a dict of parts cannot be weighted.
            raise ValueError(f"IStarLoss runs inside a loss that replaced the model's forward "
                             f"({type(swapped).__name__}), as MatryoshkaLoss and AdaptiveLayerLoss do: put IStarLoss "
                             "outside, IStarLoss(model, MatryoshkaLoss(model, loss, dims), IStarConfig(...))")
        if not self.training or not self.istar.entry.penalises:
            return self.loss(sentence_features, labels)
        if self.istar.needs_sigma_s and self.sigma_s is None:
            raise ValueError("no Σ_S yet: pass callbacks=[IStarCallback(loss)] to the trainer (or call "
                             "loss.refresh_sigma(epoch) at each epoch's start), or use zeta=0")
        transformer = self._transformer()
        captured = []

        def capture(module, inputs, features):
            captured.append((features.get("all_layer_embeddings"), features.get("attention_mask")))

        config = transformer.auto_model.config
        asked, config.output_hidden_states = config.output_hidden_states, True
        handle = transformer.register_forward_hook(capture)
        try:
            task = self.loss(sentence_features, labels)
        finally:
            handle.remove()
            config.output_hidden_states = asked
        if not captured or any(states is None for states, _ in captured):
            raise ValueError("the model's Transformer module gave no all_layer_embeddings: IStarLoss needs a Hugging "
                             "Face encoder that returns hidden states")
        states, mask = union_of_batches(captured)
        penalty = self.istar.penalty(states, mask, self.sigma_s)
        task_parts = task if isinstance(task, dict) else {"task_loss": task}
        self._istar_logs.add(penalty_logs(self.istar, sum(task_parts.values()), penalty))
        return {**task_parts, f"{self.istar.method}_penalty": penalty.term}
