"""A model's isotropy on data, in memory: ``istar.measure_isotropy``.

One pass without gradients over the batches (or texts and a tokenizer), the hidden states fed to
an :class:`istar.core.measurement.IsotropyMetric`: per layer IsoScore, IsoScore* (against Σ_S),
TwoNN of the [CLS] vectors and the average cosine similarity, and the overall IsoScore* of the
selected layers — the measures ``istar measure`` writes for a fine-tuned run, without files.
"""

from __future__ import annotations

import contextlib

from istar.core.measurement import IsotropyMetric, IsotropyReport
from istar.core.regularizers import LayerSelection
from istar.models.hidden_states import hidden_state_pass
from istar.models.shrinkage import progress_disabled, text_batches

__all__ = ["measure_isotropy"]


def measure_isotropy(model, data, tokenizer=None, *, sigma_s=None, zeta: float = 0.2, layers: LayerSelection = "all",
                     twonn: bool = True, twonn_discard: float = 0.1, batch_size: int = 32, max_length: int = 128,
                     accelerator=None, progress: bool = True) -> IsotropyReport:
    """Isotropy and intrinsic dimension of ``model``'s representations of ``data``, per layer.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        a Hugging Face encoder; run in eval mode without gradients, its mode restored after.
    data : iterable of dict, or sequence of str
        batches with ``input_ids`` and ``attention_mask`` (a ``DataLoader``); or, with
        ``tokenizer``, texts or (text, text) pairs (split across processes automatically).
    tokenizer : transformers.PreTrainedTokenizerBase, optional
        tokenises ``data`` when it holds texts (``batch_size``, ``max_length``).
    sigma_s : str, os.PathLike, list or torch.Tensor, optional
        Σ_S for IsoScore*: the path of a Σ_S file (``istar shrinkage``) or per-layer
        statistics (every layer scored against its own Σ_S, as ``istar measure``), or one
        (d, d) tensor from :func:`istar.models.shrinkage.shrinkage_covariance` of the
        ``layers`` selection (scores ``overall`` only); None: no IsoScore* (unless ζ = 0).
    zeta : float
        ζ of IsoScore* (the analysis default, 0.2).
    layers : LayerSelection
        the hidden states of the ``overall`` point cloud.
    twonn, twonn_discard : bool, float
        whether to keep the [CLS] vectors for TwoNN, and its discard fraction.
    accelerator : accelerate.Accelerator, optional
        an ``accelerate.Accelerator`` (autocast; merging across processes); without
        one, an initialised ``torch.distributed`` group is used to merge.
    progress : bool
        show a progress bar (``TQDM_DISABLE=1`` hides it too).

    Returns
    -------
    :class:`istar.core.measurement.IsotropyReport`: floats (or None) throughout;
    ``report.layers[l]`` is hidden state l (0 = embeddings), ``report.to_dict()`` the JSON of
    a measured run's analysis, its ``global`` and ``layers``.

    Examples
    --------
    >>> report = istar.measure_isotropy(model, sentences, tokenizer, sigma_s=sigma_s)   # doctest: +SKIP
    >>> [round(layer.isoscore, 3) for layer in report.layers]                         # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    if tokenizer is not None:
        data = text_batches(data, tokenizer, batch_size, max_length, accelerator)
    metric = IsotropyMetric(zeta=zeta, sigma_s=sigma_s, layers=layers, twonn_discard=twonn_discard, twonn=twonn)
    autocast = accelerator.autocast if accelerator is not None else contextlib.nullcontext
    batches = tqdm(data, desc="isotropy", unit="batch", leave=False, disable=progress_disabled(progress, accelerator))
    for batch in hidden_state_pass(model, batches, autocast=autocast):
        metric.update(batch.states, batch.mask)
    return metric.compute(accelerator)
