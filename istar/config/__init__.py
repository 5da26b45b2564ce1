"""What a run is asked to do: the configuration schema (package data) and the per-step specs built from it.

May import: io, core and registry (the layer contract: :mod:`istar.layers`); never torch at import time.
"""
