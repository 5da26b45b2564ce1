"""I-STAR: IsoScore*-based stable anisotropic regularisation (Rudman & Eickhoff, ICLR 2024).

The library, for your own training code (every name below is importable from ``istar``):

- measures: :func:`isoscore`, :func:`isoscore_star` (differentiable), :func:`twonn_dimension`,
  :func:`average_cosine_similarity`, :class:`CovarianceAccumulator`, and a model's isotropy in
  memory, per layer: :func:`measure_isotropy`, :class:`IsotropyMetric` (streaming);
- penalties: :func:`istar_penalty`, :func:`global_istar_penalty`, :func:`cosreg_penalty`, each
  returning a :class:`Penalty`; :func:`shrinkage_covariance` computes the Σ_S they shrink towards;
- training: :class:`IStarConfig` (the method of the registry, λ, ζ, a given Σ_S) for a
  ``transformers.Trainer`` (:class:`IStarTrainer`, or :class:`IStarTrainerMixin` beside another
  Trainer subclass), for a model in any loop or Trainer you do not subclass (:class:`IStarModel`,
  :class:`IStarCallback`; in Lightning, ``istar.integrations.lightning.IStarLightningCallback``), and for
  sentence-transformers (:class:`IStarLoss`).

The workflow's steps are subcommands of the ``istar`` command (:mod:`istar.cli`).
The names are imported on first use, so that ``import istar.pipeline.validate`` (which
Snakemake does while it builds the DAG) does not pull in torch.
"""

__version__ = "0.2.0"

_HOMES = {  # module → the names of the library it defines
    "core.isotropy": ("isoscore", "isoscore_star", "isoscore_star_from_covariance"),
    "core.baseline_measures": ("average_cosine_similarity", "partition_isotropy"),
    "core.covariance": ("CovarianceAccumulator",), "core.twonn": ("twonn_dimension",),
    "core.regularizers": ("cosreg_penalty", "global_istar_penalty", "istar_penalty", "Penalty"),
    "core.measurement": ("IsotropyMetric", "IsotropyReport"),
    "models.shrinkage": ("shrinkage_covariance",), "models.measurement": ("measure_isotropy",),
    "integrations.config": ("IStarConfig",), "integrations.trainer": ("IStarTrainer", "IStarTrainerMixin"),
    "integrations.wrapper": ("IStarModel", "IStarCallback"), "integrations.sentence_transformers": ("IStarLoss",),
}
_LIBRARY = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_LIBRARY)


def __getattr__(name: str):
    if name not in _LIBRARY:
        raise AttributeError(f"module 'istar' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_LIBRARY[name]}", __name__), name)


def __dir__():
    return sorted([*globals(), *_LIBRARY])
