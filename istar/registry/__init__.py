"""What exists: the tasks (their files, labels and metrics), the fine-tuning methods, the precisions
and whose Σ_S the analysis uses.

May import: io and core (the layer contract: :mod:`istar.layers`).
"""
