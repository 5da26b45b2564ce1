"""The mathematics: IsoScore, IsoScore*, streaming covariances, TwoNN, the I-STAR and CosReg
penalties, task metrics.

Functions and accumulators of tensors and arrays (torch, numpy, scipy) that load no model, data set or
config. The one file core reads and writes is Σ_S's (:mod:`istar.core.shrinkage`, through
:mod:`istar.io.sigma_file`).

May import: io (the layer contract: :mod:`istar.layers`).
"""
