"""One optimization step of a fine-tune (:mod:`istar.steps.train` runs the loop around it): the optimizer,
the forward pass with the task loss and the method's penalty, that part compiled as ``training.compile`` asks
(:func:`step_forward`: torch.compile, CUDA graphs, or a one-line refusal where it cannot run), the backward
and the optimizer and scheduler steps under accelerate."""

from __future__ import annotations

import os
import shutil
import warnings

import torch

from istar.config.specs import TrainSpec
from istar.registry.compile_modes import get_compile_mode
from istar.registry.methods import get_method

__all__ = ["build_optimizer", "forward_and_loss", "step_forward",
           "optimization_step", "warn_on_recompiles", "RECOMPILE_WARN_LIMIT"]

# Graphs a compiled step may compile after its first batch before it warns: a few batch lengths
# (istar.registry.compile_modes.BUCKET_MULTIPLE) and a last, shorter batch fit under it.
RECOMPILE_WARN_LIMIT = 12


def build_optimizer(model, spec: TrainSpec) -> torch.optim.Optimizer:
    """AdamW (ε = ``spec.adam_epsilon``) with ``spec.weight_decay`` on every weight but biases and normalisation gains."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith(no_decay)]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith(no_decay)]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.learning_rate, eps=spec.adam_epsilon)


def forward_and_loss(model, batch: dict, spec: TrainSpec, sigma_s, distributed: bool, autocast_dtype=None):
    """The forward pass, the task loss and the method's penalty: the part of a step that ``training.compile``
    compiles (:func:`step_forward`). The penalty runs under the forward's autocast (``autocast_dtype``; None: off),
    so that IsoScore*'s product runs in that dtype (:func:`istar.core.isotropy.isoscore_star`).

    Returns (loss, model outputs, Penalty or None)."""
    method = get_method(spec.method)
    outputs = model(**batch, output_hidden_states=method.penalises)
    if not method.penalises:
        return outputs.loss, outputs, None
    with torch.autocast(batch["attention_mask"].device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        penalty = method.penalise(outputs.hidden_states, batch["attention_mask"], lam=spec.lam, zeta=spec.zeta,
                                  sigma_s=sigma_s, layers=spec.layers, tokens=spec.tokens,
                                  global_batch=spec.global_penalty and distributed)
    return outputs.loss + penalty.term, outputs, penalty


def step_forward(mode: str, device: torch.device):
    """:func:`forward_and_loss` as ``training.compile`` asks: itself (none), ``torch.compile``d (default), or
    compiled and replayed as CUDA graphs (reduce-overhead, each call a new graph step). Raises ValueError
    naming the setting and the fix where the mode cannot run on ``device`` (CUDA graphs off CUDA; no C/C++
    compiler for inductor's kernels). A compiled step warns once when it has compiled more than
    :data:`RECOMPILE_WARN_LIMIT` graphs after its first call (:func:`warn_on_recompiles`)."""
    compile_mode = get_compile_mode(mode)
    if not compile_mode.compiles:
        return forward_and_loss
    if compile_mode.captures_graphs and device.type != "cuda":
        raise ValueError(f"training.compile = {mode} captures the step as CUDA graphs, which need a CUDA device; "
                         f"this run is on {device.type}: set training.compile to default (compiled, no graphs) or none")
    # inductor builds CPU kernels with a C++ compiler; on a GPU, Triton builds its kernel launchers with a C compiler
    language, names = (("C++", ("CXX", "g++", "c++", "clang++")) if device.type == "cpu"
                       else ("C", ("CC", "cc", "gcc", "clang")))
    if not any(shutil.which(name) for name in (os.environ.get(names[0]), *names[1:]) if name):
        raise ValueError(f"training.compile = {mode} needs a {language} compiler to build the step's kernels "
                         f"(torch.compile's inductor on {device.type}) and none was found ({', '.join(names[1:])} or "
                         f"${names[0]}): install one or set training.compile: none")
    compiled = torch.compile(forward_and_loss, mode=compile_mode.torch_mode)

    def step(*args, **kwargs):
        if compile_mode.captures_graphs:
            # the outputs of the previous call (already read: losses and logs are taken as floats) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)

    return warn_on_recompiles(step, mode, RECOMPILE_WARN_LIMIT)


def warn_on_recompiles(compiled, mode: str, limit: int):
    """``compiled`` that warns (once) when more than ``limit`` graphs were compiled after its first call.

    The first call compiles the step's pieces (one graph per region between graph breaks); each graph
    after it is a recompilation for a new batch shape or a changed guard, which costs seconds, and
    under CUDA graphs a new recording. The count is torch._dynamo's ``unique_graphs`` (process-wide;
    nothing else in a fine-tune is compiled)."""
    from torch._dynamo.utils import counters

    first: int | None = None  # graphs compiled once the first call is done; None: no call yet
    warned = False

    def watched(*args, **kwargs):
        nonlocal first, warned
        result = compiled(*args, **kwargs)
        graphs = counters["stats"]["unique_graphs"]
        if first is None:
            first = graphs
        elif graphs - first > limit and not warned:
            warned = True
            warnings.warn(f"training.compile = {mode}: the step has been compiled {graphs - first} more times since "
                          "its first batch (new batch shapes or guards), each recompilation costing seconds (and under "
                          "CUDA graphs a new recording); if it goes on, set training.compile to none",
                          RuntimeWarning, stacklevel=2)
        return result

    return watched


def optimization_step(spec: TrainSpec, accelerator, model, optimizer, scheduler, batch: dict, sigma_s,
                      distributed: bool, forward=forward_and_loss):
    """One micro-batch of training: forward, task loss + penalty (``forward``: :func:`forward_and_loss`, or its
    compiled form from :func:`step_forward`), backward, and (when the accumulated gradients are
    synchronised) clipping and the optimizer and scheduler steps.

    Returns (loss, model outputs, Penalty or None); ``loss`` still carries the graph.
    """
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision)
    with accelerator.accumulate(model):
        loss, outputs, penalty = forward(model, batch, spec, sigma_s, distributed, autocast_dtype)
        accelerator.backward(loss)
        if accelerator.sync_gradients and spec.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return loss, outputs, penalty
