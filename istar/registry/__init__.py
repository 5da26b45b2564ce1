"""What exists: the tasks (their files, labels and metrics) and the fine-tuning methods.

May import :mod:`istar.io` and :mod:`istar.core`.
"""
