"""Σ_S of a model: forward passes over data, token rows streamed into per-layer statistics.

:func:`shrinkage_covariance` is the library's entry point (``istar.shrinkage_covariance``): a
model and batches (or texts and a tokenizer) in, the (d, d) Σ_S that
:func:`istar.core.regularizers.istar_penalty` takes out. :func:`accumulate_shrinkage` is the
pass behind it and behind ``istar shrinkage``, fine-tuning's per-epoch Σ_S and the Trainer
integration: every hidden state's statistics (:mod:`istar.core.shrinkage`), merged across
processes.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from istar.config.schema import default_of
from istar.core.covariance import CovarianceAccumulator
from istar.core.regularizers import LayerSelection, resolve_layers
from istar.core.shrinkage import add_hidden_states, current_processes, merge_across_processes, merge_layers
from istar.core.tokens import get_token_selection
from istar.models.hidden_states import hidden_state_pass

__all__ = ["progress_disabled", "forked_rng", "accumulate_shrinkage", "SigmaStatistics",
           "sigma_statistics", "shrinkage_covariance", "text_batches", "SigmaSchedule"]


def progress_disabled(show: bool = True, accelerator=None) -> bool:
    """Whether a progress bar stays hidden: not asked for (``show``), not on the main process of its machine
    (``accelerator``'s, else the one whose ``LOCAL_RANK`` is 0), or ``TQDM_DISABLE`` set to a true value."""
    main = accelerator.is_local_main_process if accelerator is not None else int(os.environ.get("LOCAL_RANK", "0")) == 0
    return not (show and main) or os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def forked_rng(device: torch.device) -> Iterator[None]:
    """torch's random state, of the CPU and of ``device``, as it was before the block.

    The library's Σ_S passes run inside it: a data loader draws its seed from torch's generator
    when it starts, so without the fork a Σ_S pass would move the random state training reads
    next (dropout, the data order), and λ = 0 with ζ > 0 would train differently from ζ = 0.
    """
    device = torch.device(device)
    devices = [] if device.type == "cpu" else [
        device.index if device.index is not None else torch.get_device_module(device.type).current_device()]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield


@torch.no_grad()
def accumulate_shrinkage(model, loader: Iterable[dict], layers: LayerSelection = "all", shrinkage_rows: int | None = None,
                         accelerator=None, description: str = "Σ_S", tokens: str = "real",
                         progress: bool = True) -> list[CovarianceAccumulator]:
    """Accumulate per-layer token statistics until the selected layers gave ``shrinkage_rows`` rows.

    Every hidden state (embeddings and each layer) gets its own accumulator, at no extra
    forward cost; Σ_S of any layer selection is then the merge of those layers'
    accumulators (:func:`istar.core.shrinkage.merge_layers`).

    Parameters
    ----------
    model : a Hugging Face model (unwrapped); run in eval mode here, its mode restored after.
    loader : batches with ``input_ids`` and ``attention_mask`` (B, T); targets are ignored.
        Under several processes each process reads its own shard (a loader prepared by
        accelerate, or one with a ``DistributedSampler``).
    layers : the selection whose rows (tokens × selected layers) are counted against
        ``shrinkage_rows`` (see :data:`istar.core.regularizers.LayerSelection`).
    shrinkage_rows : stop once the selected layers hold this many rows, all processes together;
        fewer if the data runs out. None: the config schema's ``shrinkage.rows`` (250,000, the paper's).
    accelerator : an ``accelerate.Accelerator`` for autocast and the merge across processes;
        None runs on the model's device and merges through ``torch.distributed`` when a
        process group with several ranks is initialised (:func:`istar.core.shrinkage.current_processes`).
    description : the progress bar's label.
    tokens : which positions of each (padded) batch are rows (:data:`istar.core.tokens.TOKEN_SELECTIONS`):
        ``real`` the attention-masked tokens, ``all_positions`` all B·T positions.
    progress : show a progress bar (on the main process, counting batches out of the loader's
        length; ``TQDM_DISABLE=1`` hides it too).

    Returns
    -------
    list of L + 1 CovarianceAccumulator, index = hidden state (0 = embeddings); identical
    on every process. Hidden states holding NaN or inf raise :class:`istar.core.shrinkage.NonFiniteStatistics`.
    """
    from tqdm.auto import tqdm

    shrinkage_rows = int(default_of("shrinkage.rows") if shrinkage_rows is None else shrinkage_rows)
    if shrinkage_rows < 2:
        raise ValueError(f"shrinkage_rows = {shrinkage_rows}: Σ_S needs at least 2 rows "
                         f"(the default is {default_of('shrinkage.rows'):,})")
    processes = current_processes(accelerator)
    target = math.ceil(shrinkage_rows / processes.size)
    device = next(model.parameters()).device
    # Accumulators exist before the first batch: a process whose shard is empty still joins the merge.
    per_layer = [CovarianceAccumulator(model.config.hidden_size, device=device)
                 for _ in range(model.config.num_hidden_layers + 1)]
    selected = resolve_layers(layers, len(per_layer))
    selection = get_token_selection(tokens)
    autocast = accelerator.autocast if accelerator is not None else contextlib.nullcontext
    total = len(loader) if hasattr(loader, "__len__") else None
    with tqdm(total=total, unit="batch", desc=description, disable=progress_disabled(progress, accelerator),
              leave=False) as bar:
        for batch in hidden_state_pass(model, loader, device=device, autocast=autocast):
            add_hidden_states(per_layer, batch.states, selection.mask(batch.mask))
            rows = sum(per_layer[i].count for i in selected)
            bar.update(1)
            bar.set_postfix_str(f"{rows:,} of {target:,} rows", refresh=False)
            if rows >= target:
                break
    per_layer = [merge_across_processes(accumulator, processes) for accumulator in per_layer]
    if per_layer[0].count == 0:
        raise ValueError("the data loader yielded no batches: cannot estimate Σ_S")
    return per_layer


@dataclass(frozen=True)
class SigmaStatistics:
    """What one Σ_S pass (:func:`sigma_statistics`) gives."""

    per_layer: list[CovarianceAccumulator]  # every hidden state's statistics, as accumulate_shrinkage returns them
    layers: list[int]  # the hidden states of the layer selection
    selection: CovarianceAccumulator  # their merge: .covariance() is Σ_S, .count its rows


def sigma_statistics(model, loader: Iterable[dict], layers: LayerSelection = "all", shrinkage_rows: int | None = None,
                     accelerator=None, description: str = "Σ_S", tokens: str = "real",
                     progress: bool = True) -> SigmaStatistics:
    """The one Σ_S pass: :func:`accumulate_shrinkage` (same arguments), then the merge of the selected
    layers. ``istar shrinkage``, the measurement's fine-tuned Σ_S, fine-tuning's per-epoch Σ_S
    (:func:`istar.steps.shrinkage.training_statistics`) and :func:`shrinkage_covariance` all call it."""
    per_layer = accumulate_shrinkage(model, loader, layers, shrinkage_rows, accelerator, description=description,
                                     tokens=tokens, progress=progress)
    indices = resolve_layers(layers, len(per_layer))
    return SigmaStatistics(per_layer, indices, merge_layers(per_layer, indices))


def text_batches(texts: Sequence, tokenizer, batch_size: int = 32, max_length: int = 128,
                 accelerator=None) -> list[dict]:
    """Tokenised, padded batches of ``texts``: strings, or (text, text) pairs for paired tasks.

    Under several processes (``accelerator``'s, else an initialised ``torch.distributed`` group:
    :func:`istar.core.shrinkage.current_processes`) process r of P keeps every P-th text from the r-th on,
    so that each process of a data-parallel run reads its own part.
    """
    processes = current_processes(accelerator)
    texts = list(texts)[processes.rank::processes.size]
    if texts and not isinstance(texts[0], (str, tuple, list)):
        raise TypeError(f"texts must be strings or (text, text) pairs; got {type(texts[0]).__name__} "
                        "(pass tokenised batches as a DataLoader instead, without tokenizer=)")
    chunks = [texts[start:start + batch_size] for start in range(0, len(texts), batch_size)]
    # a chunk of pairs is tokenised as two columns, its first and its second texts
    return [dict(tokenizer(*((chunk,) if isinstance(chunk[0], str) else map(list, zip(*chunk))), padding=True,
                           truncation=True, max_length=max_length, return_tensors="pt")) for chunk in chunks]


def shrinkage_covariance(model, data, tokenizer=None, *, layers: LayerSelection = "all", tokens: str = "real",
                         shrinkage_rows: int | None = None, batch_size: int = 32, max_length: int = 128,
                         accelerator=None, progress: bool = True, description: str = "Σ_S") -> torch.Tensor:
    """Σ_S of ``model`` on ``data``: the shrinkage covariance :func:`istar.core.regularizers.istar_penalty` takes.

    The covariance of the token vectors at ``layers`` and ``tokens`` (the same selections the
    penalty is given), from forward passes without gradients, over at least ``shrinkage_rows`` rows
    or all of ``data`` (docs/method.md §3). Rows are never stacked: the sums are float64 and
    O(d²) per hidden state.

    The paper recomputes Σ_S from the current model at the start of every epoch; call this
    again then (see :func:`istar.core.regularizers.istar_penalty`).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        a Hugging Face encoder (unwrapped: ``accelerator.unwrap_model(model)`` under
        accelerate); its training mode is restored afterwards.
    data : iterable of dict, or sequence of str
        batches with ``input_ids`` and ``attention_mask`` (a ``DataLoader``; other keys are
        ignored; under several processes, each process's shard); or, with ``tokenizer``,
        a sequence of texts, or of (text, text) pairs.
    tokenizer : transformers.PreTrainedTokenizerBase, optional
        tokenises ``data`` when it holds texts (split across processes automatically).
    layers : LayerSelection
        the hidden states whose rows form Σ_S (see :data:`istar.core.regularizers.LayerSelection`).
    tokens : str
        ``"real"`` (attention-masked tokens) or ``"all_positions"`` (every padded position).
    shrinkage_rows : int, optional
        the row budget (tokens × selected layers, all processes together); None: the
        schema's ``shrinkage.rows``, 250,000 as in the paper.
    batch_size, max_length : int
        how texts are batched and truncated (with ``tokenizer`` only).
    accelerator : accelerate.Accelerator, optional
        an ``accelerate.Accelerator`` (autocast, merge); without one, an initialised
        ``torch.distributed`` group is used to merge, and one process needs nothing.
    progress : bool
        show a progress bar (``TQDM_DISABLE=1`` hides it too).
    description : str
        the progress bar's label.

    Returns
    -------
    (d, d) float64 tensor on the model's device, identical on every process. torch's random
    state is left as it was (:func:`forked_rng`).

    Examples
    --------
    >>> sigma_s = istar.shrinkage_covariance(model, train_loader, shrinkage_rows=20_000)   # doctest: +SKIP
    >>> sigma_s = istar.shrinkage_covariance(model, sentences, tokenizer)           # doctest: +SKIP
    """
    if tokenizer is not None:
        data = text_batches(data, tokenizer, batch_size, max_length, accelerator)
    elif isinstance(data, (str, bytes)) or (isinstance(data, Sequence) and data and isinstance(data[0], str)):
        raise TypeError("data holds texts: pass the tokenizer too (shrinkage_covariance(model, texts, tokenizer))")
    with forked_rng(next(model.parameters()).device):
        statistics = sigma_statistics(model, data, layers, shrinkage_rows, accelerator, description=description,
                                      tokens=tokens, progress=progress)
    return statistics.selection.covariance().to(next(model.parameters()).device)


@dataclass
class SigmaSchedule:
    """Which Σ_S a penalty reads in each epoch: the one rule of ``istar train``
    (:mod:`istar.steps.sigma_tracking`) and of the library's integrations
    (:class:`istar.integrations.config.SigmaSchedule`).

    At the start of the first epoch: the given Σ_S, else one computed from the model; at the start of
    a later epoch: one recomputed from the current model when ``recompute``, else the same. Without
    ``needed`` (ζ = 0, or a method that reads no Σ_S) there is none.

    Attributes
    ----------
    needed, recompute : bool
        Whether the penalty reads a Σ_S; whether a later epoch gets a new one.
    sigma_s : torch.Tensor or None
        The current Σ_S, (d, d) float64.
    sigma_epoch : int
        The epoch (0-based) whose start Σ_S was set at (−1 before the first).
    """

    needed: bool
    recompute: bool
    sigma_s: torch.Tensor | None = None
    sigma_epoch: int = -1

    def due(self, epoch: int) -> bool:
        """Whether Σ_S is to be set at the start of ``epoch`` (0-based)."""
        return epoch > self.sigma_epoch and (self.sigma_epoch < 0 or self.recompute)

    def advance(self, epoch: int, compute, given=None) -> torch.Tensor | None:
        """Set Σ_S for the start of ``epoch`` if :meth:`due`: ``given()`` at the first epoch unless it is None
        (or returns None), else ``compute()``. Returns the new Σ_S; None when nothing was set."""
        if not self.due(epoch):
            return None
        first, self.sigma_epoch = self.sigma_epoch < 0, epoch
        if not self.needed:
            return None
        sigma = given() if first and given is not None else None
        self.sigma_s = compute() if sigma is None else sigma
        return self.sigma_s
