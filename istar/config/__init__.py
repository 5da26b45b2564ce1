"""What a run is asked to do: the configuration schema (package data) and the per-step specs built from it.

May import :mod:`istar.io`, :mod:`istar.core` and :mod:`istar.registry`; never torch at import time.
"""
