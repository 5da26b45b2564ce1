"""The values of ``training.compile``: how a fine-tuning step is compiled, and what each one needs.

    key              torch.compile mode   CUDA graphs   batches padded to
    none             (eager)              no            the longest sequence (a multiple of 8 in fp16/bf16)
    default          default              no            a multiple of :data:`BUCKET_MULTIPLE` tokens
    reduce-overhead  reduce-overhead      yes           a multiple of :data:`BUCKET_MULTIPLE` tokens

Why the buckets: a compiled step meets a new graph (or, with CUDA graphs, records a new one) for
every new batch shape, and batches padded to their longest sequence take nearly every length up
to ``training.max_length``. Padded to a multiple of 32 tokens, a max_length of 256 gives at most
8 lengths. Where the penalty counts padding (``penalty.tokens: all_positions``) a batch cannot be
padded further without changing the penalty, so there CUDA graphs are refused; so are they with
gradient accumulation, since a replayed graph may overwrite the gradients accumulated by the
micro-batch before it (pytorch/pytorch issues 96693 and 169545).

No torch import here: the configuration's validation reads this registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from istar.core.tokens import get_token_selection
from istar.registry import lookup

__all__ = ["CompileMode", "COMPILE_MODES", "BUCKET_MULTIPLE", "get_compile_mode", "compile_conflict"]

# Tokens a compiled step's batch lengths are rounded up to (a multiple of the 8 that fp16/bf16 kernels want).
BUCKET_MULTIPLE = 32


@dataclass(frozen=True)
class CompileMode:
    """One value of ``training.compile``.

    key : the config value.
    torch_mode : torch.compile's ``mode``; None: the step runs eagerly.
    captures_graphs : whether the compiled step is replayed as CUDA graphs (a CUDA device only).
    """

    key: str
    torch_mode: str | None
    captures_graphs: bool

    @property
    def compiles(self) -> bool:
        return self.torch_mode is not None


COMPILE_MODES: dict[str, CompileMode] = {mode.key: mode for mode in (
    CompileMode("none", None, captures_graphs=False),
    CompileMode("default", "default", captures_graphs=False),
    CompileMode("reduce-overhead", "reduce-overhead", captures_graphs=True),
)}


def get_compile_mode(key: str) -> CompileMode:
    """Look a compile mode up, with an error that lists the known ones."""
    return lookup(COMPILE_MODES, key, "compile mode", "training.compile")


def compile_conflict(compile: str, gradient_accumulation_steps: int, tokens: str) -> str | None:
    """Why ``training.compile`` cannot go with these settings (one line naming them and the fix), or None."""
    if not get_compile_mode(compile).captures_graphs:
        return None
    if gradient_accumulation_steps > 1:
        return (f"training.compile = {compile} replays CUDA graphs, which may overwrite the gradients accumulated over "
                f"training.gradient_accumulation_steps = {gradient_accumulation_steps} micro-batches; set "
                "training.compile to default, or gradient_accumulation_steps to 1 (with a batch_size that many times larger)")
    if not get_token_selection(tokens).pad_multiple:
        return (f"training.compile = {compile} records a CUDA graph per batch length, and penalty.tokens = {tokens} "
                "counts padding, so batches keep their own lengths (a graph nearly every step); set training.compile "
                "to default, or penalty.tokens to real")
    return None
