"""Integrations with other training libraries: the ``transformers.Trainer`` (:mod:`istar.integrations.trainer`).

May import: io, core, registry, config, data and models (the layer contract:
:mod:`istar.layers`). Nothing in the workflow imports it.
"""
