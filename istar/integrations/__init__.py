"""Integrations with other training libraries: the ``transformers.Trainer`` (:mod:`istar.integrations.trainer`).

May import the layers below it (io, core, registry, config, data, models); nothing in the
workflow imports it.
"""
