"""One module per ``istar`` sub-command that runs a model: spec in, files out (prepare-data lives in
:mod:`istar.data.prepare`). Also the launcher and resumable training states.

May import every layer below it (io, core, registry, config, data, models).
"""
