"""The mathematics: IsoScore, IsoScore*, streaming covariances, TwoNN, the I-STAR and CosReg
penalties, task metrics.

Pure functions on tensors and arrays (torch, numpy, scipy).

May import: io (the layer contract: :mod:`istar.layers`).
"""
