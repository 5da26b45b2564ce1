"""One module per ``istar`` sub-command that runs a model: spec in, files out (prepare-data lives in
:mod:`istar.data.prepare`). Also the launcher and resumable training states.

May import: io, core, registry, config, data and models (the layer contract: :mod:`istar.layers`).
"""
