"""Integrations with other training libraries: the settings they share (:mod:`istar.integrations.config`),
the ``transformers.Trainer`` (:mod:`istar.integrations.trainer`), the model wrapper
(:mod:`istar.integrations.wrapper`), Lightning (:mod:`istar.integrations.lightning`) and sentence-transformers
(:mod:`istar.integrations.sentence_transformers`).

May import: io, core, registry, config, data and models (the layer contract:
:mod:`istar.layers`). Nothing in the workflow imports it.
"""
