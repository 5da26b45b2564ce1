"""Model sources: hub ids pinned to commits, local folders, packages, GGUF files; loading encoders,
tokenizers and any pretrained model for profiling.

May import the layers below it (io, core, registry, config, data).
"""
