"""From results to what a reader sees: search selection, aggregate CSVs, tables and figures.

May import: io, core (its numpy-only parts), registry and config (the layer contract:
:mod:`istar.layers`); the run folders and measurement files it reads come through
:mod:`istar.io.results`. Never imports torch, transformers, accelerate or datasets.
"""
