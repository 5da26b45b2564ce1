"""I-STAR: IsoScore*-based stable anisotropic regularisation (Rudman & Eickhoff, ICLR 2024).

Library: ``isotropy`` (IsoScore, IsoScore*, streaming covariance, TwoNN and comparison
measures) and ``regularizers`` (the I-STAR and CosReg penalties on model hidden states).
Engine and workflow steps, each behind a subcommand of the ``istar`` command (``istar.cli``):
``data``, ``shrinkage``, ``train``, ``evaluate``, ``activations``, ``analysis``, ``measure``,
``selection``, ``aggregate``, ``tables``, ``plots``; ``config`` and ``plan`` serve the Snakemake workflow.

The library names below are imported on first use, so that ``import istar.pipeline.validate`` (which
Snakemake does while it builds the DAG) does not pull in torch.
"""

__version__ = "0.1.0"

_LIBRARY = {
    "CovarianceAccumulator": "core.isotropy",
    "average_cosine_similarity": "core.isotropy",
    "isoscore": "core.isotropy",
    "isoscore_star": "core.isotropy",
    "isoscore_star_from_covariance": "core.isotropy",
    "partition_isotropy": "core.isotropy",
    "twonn_dimension": "core.twonn",
    "cosreg_penalty": "core.regularizers",
    "istar_penalty": "core.regularizers",
}

__all__ = sorted(_LIBRARY)


def __getattr__(name: str):
    if name not in _LIBRARY:
        raise AttributeError(f"module 'istar' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_LIBRARY[name]}", __name__), name)


def __dir__():
    return sorted([*globals(), *_LIBRARY])
