"""The Σ_S file format: safetensors of every hidden state's token statistics, with their provenance.

One file holds, for a model's L + 1 hidden states (0 = embeddings), the streaming statistics
of their token rows and Σ_S of one layer selection:

    sigma            (d, d) float64   Σ_S of the selection (the union of its layers' rows)
    mean             (d,)   float64   the selection's mean
    per_layer.count  (L+1,) int64     rows per hidden state
    per_layer.mean   (L+1, d)         each hidden state's mean
    per_layer.m2     (L+1, d, d)      each hidden state's centred second moment Σ (x − x̄)(x − x̄)ᵀ

and the metadata ``provenance`` (JSON, with ``layers`` and ``rows`` of the selection) and the
tensors' ``sha256`` (:func:`istar.io.artifacts.save_tensors`). The per-layer statistics let any
other layer selection's Σ_S be rebuilt exactly (:func:`istar.core.shrinkage.load_shrinkage`).

This module knows the file and nothing of covariances: :mod:`istar.core.shrinkage` turns
its tensors into accumulators and back.
"""

from __future__ import annotations

import json
from pathlib import Path

from istar.io import artifacts

__all__ = ["PER_LAYER_TENSORS", "first_non_finite", "write_sigma_file", "read_sigma_file"]

PER_LAYER_TENSORS = ("per_layer.count", "per_layer.mean", "per_layer.m2")
"""The tensors that make a file a Σ_S file (the per-layer statistics)."""


def first_non_finite(tensors: dict) -> str | None:
    """The name of the first floating-point tensor holding NaN or ±inf, or None."""
    import torch

    return next((name for name, tensor in tensors.items()
                 if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())), None)


def write_sigma_file(path, tensors: dict, provenance: dict) -> None:
    """Write the tensors of the module docstring and their provenance atomically (no checks here)."""
    artifacts.save_tensors(path, tensors, {"provenance": json.dumps(provenance, default=str)})


def read_sigma_file(path) -> tuple[dict, dict]:
    """(tensors, provenance) of a Σ_S file, after checking it is complete, unchanged and finite.

    A missing file raises ``FileNotFoundError`` naming the step that writes it; a damaged one
    (unreadable, tensors that differ from the hash recorded at write time, not a Σ_S file, or
    NaN / inf anywhere, which the writer never stores) :class:`istar.io.artifacts.DamagedArtifactError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shrinkage matrix {path} does not exist: compute it with `istar shrinkage` first "
                                "(or `istar.shrinkage_covariance` in your own code)")
    tensors, metadata = artifacts.load_tensors(path)
    if "provenance" not in metadata or any(name not in tensors for name in PER_LAYER_TENSORS):
        raise artifacts.DamagedArtifactError(path, "not a Σ_S file written by `istar shrinkage` (no per-layer "
                                                   "statistics or provenance)")
    if (bad := first_non_finite(tensors)) is not None:
        raise artifacts.DamagedArtifactError(path, f"it holds NaN or inf in {bad}, which `istar shrinkage` never "
                                                   "writes")
    return tensors, json.loads(metadata["provenance"])
