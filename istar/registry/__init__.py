"""What exists: the tasks (their files, labels and metrics), the fine-tuning methods and the precisions.

May import :mod:`istar.io` and :mod:`istar.core`.
"""
