"""What exists: the tasks (their files, labels and metrics), the fine-tuning methods, the precisions,
whose Σ_S the analysis uses and what a study does with a collapsed run.

May import: io and core (the layer contract: :mod:`istar.layers`).
"""


def lookup(entries: dict, key, what: str, setting: str | None = None):
    """``entries[key]``; an unknown key is a ValueError naming ``what`` it was meant to be, the config
    ``setting`` that gives it (where one does) and the known keys."""
    try:
        return entries[key]
    except KeyError:
        where = f" ({setting})" if setting else ""
        raise ValueError(f"unknown {what} {key!r}{where}; known {what}s: {', '.join(map(str, entries))}") from None
