"""The one pass that streams a model's hidden states: Σ_S, activations, measurement and the survey read it.

Each consumer accumulates something else (per-layer covariances, [CLS] vectors,
a profile's statistics); what they share is here: eval mode (restored afterwards), no gradient,
the model's inputs moved to its device, the forward pass under the caller's autocast, and the
mask of the real (non-padding) tokens.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from istar.data.encoding import MODEL_INPUTS

__all__ = ["HiddenStates", "hidden_state_pass"]


@dataclass
class HiddenStates:
    """One batch of a pass.

    states : list of L + 1 tensors (B, T, d), index = hidden state (0 = embeddings), in the
        forward pass's dtype (the autocast's where one is active); more where the caller's
        ``extra_states`` adds some.
    mask : (B, T) bool, True at real tokens (the attention mask).
    seconds : wall time of the forward pass, in seconds.
    """

    states: list[torch.Tensor]
    mask: torch.Tensor
    seconds: float


def hidden_state_pass(model, batches: Iterable[dict], *, device=None,
                      autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                      extra_states: Callable[[], list[torch.Tensor]] | None = None) -> Iterator[HiddenStates]:
    """Run ``model`` over ``batches`` and yield each batch's hidden states and real-token mask.

    Parameters
    ----------
    model : a Hugging Face model that accepts ``output_hidden_states=True``.
    batches : dicts of (B, T) tensors; keys other than the model inputs (labels, offsets) are ignored.
    device : where the inputs go (default: the model's first parameter's device).
    autocast : a context factory for the forward pass, e.g. ``accelerator.autocast``.
    extra_states : called after each forward pass; its tensors (B, T, d) are appended to
        ``states`` (e.g. a decoder's last layer before its final norm, captured by a hook).

    The model runs in eval mode without gradients and gets its training mode back when the
    pass ends, also when the consumer stops early.
    """
    device = device if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            inputs = {key: value.to(device) for key, value in batch.items() if key in MODEL_INPUTS}
            if "attention_mask" not in inputs:
                raise ValueError(f"the batches have no attention_mask (keys: {', '.join(batch)}): keep the "
                                 "tokenizer's attention_mask in each batch (a collator such as "
                                 "DataCollatorWithPadding pads it), so that padding is left out")
            started = time.perf_counter()
            with torch.no_grad(), autocast():
                outputs = model(**inputs, output_hidden_states=True)
            seconds = time.perf_counter() - started
            if getattr(outputs, "hidden_states", None) is None:
                raise ValueError(f"{type(model).__name__} returned no hidden_states although called with "
                                 "output_hidden_states=True: I-STAR needs a Hugging Face model whose forward takes "
                                 "output_hidden_states=True and returns a ModelOutput")
            states = list(outputs.hidden_states)
            if extra_states is not None:
                states += extra_states()
            yield HiddenStates(states=states, mask=inputs["attention_mask"].bool(), seconds=seconds)
    finally:
        model.train(was_training)
