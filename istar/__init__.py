"""I-STAR: IsoScore*-based stable anisotropic regularisation (Rudman & Eickhoff, ICLR 2024).

Library: ``isotropy`` (IsoScore, IsoScore*, streaming covariance, TwoNN and comparison
measures) and ``regularizers`` (the I-STAR and CosReg penalties on model hidden states).
Engine and workflow steps, each behind a subcommand of the ``istar`` command (``istar.cli``):
``data``, ``shrinkage``, ``train``, ``evaluate``, ``activations``, ``analysis``, ``selection``,
``aggregate``, ``tables``, ``plots``; ``config`` and ``plan`` serve the Snakemake workflow.
"""

from .isotropy import (
    CovarianceAccumulator,
    average_cosine_similarity,
    isoscore,
    isoscore_star,
    isoscore_star_from_covariance,
    partition_isotropy,
    twonn_dimension,
)
from .regularizers import cosreg_penalty, istar_penalty

__version__ = "0.1.0"

__all__ = [
    "CovarianceAccumulator",
    "average_cosine_similarity",
    "cosreg_penalty",
    "isoscore",
    "isoscore_star",
    "isoscore_star_from_covariance",
    "istar_penalty",
    "partition_isotropy",
    "twonn_dimension",
]
