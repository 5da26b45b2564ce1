"""From results to what a reader sees: search selection, aggregate CSVs, tables and figures.

Never imports torch. May import io, core (numpy-only parts), registry and config.
"""
