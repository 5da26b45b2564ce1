"""Model sources: hub ids pinned to commits, local folders, packages, GGUF files; loading encoders,
tokenizers and any pretrained model for the survey.

May import: io, core, registry, config and data (the layer contract: :mod:`istar.layers`).
"""
