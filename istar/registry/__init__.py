"""What exists: the tasks (their files, labels and metrics), the fine-tuning methods, the precisions,
whose Σ_S the analysis uses and what a study does with a collapsed run.

May import: io and core (the layer contract: :mod:`istar.layers`).
"""
