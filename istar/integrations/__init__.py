"""Integrations with other training libraries: the settings they share (:mod:`istar.integrations.config`) and
the ``transformers.Trainer`` (:mod:`istar.integrations.trainer`).

May import: io, core, registry, config, data and models (the layer contract:
:mod:`istar.layers`). Nothing in the workflow imports it.
"""
