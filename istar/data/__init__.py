"""Benchmark data: load each task from the Hugging Face hub or an offline mirror, normalise it.

Every task of :mod:`istar.registry.tasks` is turned into two ``pandas.DataFrame`` splits, ``train`` and
``validation`` (GLUE's dev set, the evaluation split), with the columns of the
:mod:`istar.registry.tasks` docstring:

- classification / regression: ``idx`` (int64, the row's position in its source split),
  ``text_a`` (str), ``text_b`` (str, null for single-sentence tasks), ``label`` (int64 class,
  or float32 score in [0, 5] for STS-B);
- qa (SQuAD v1.1): ``id``, ``title``, ``context``, ``question`` (str), ``answer_texts``
  (list of str), ``answer_starts`` (list of int64 character offsets into ``context``).

One concern per module:

================  ==============================================================
``readers``       parsers of the release files (GLUE TSV, SST-5 trees, SQuAD json)
``mirror``        the offline mirror folder: layout, loading, file checksums, and a seeded
                  stand-in split when it lacks one split
``hub``           the ``datasets`` library: hub ids, configs, column mapping
``normalise``     the normalised schema and the checks every split passes
``storage``       the prepared folder: parquet files and ``meta.json``
``prepare``       :func:`load_task`, :func:`prepare_task`, ``istar prepare-data``
``encoding``      tokenised features and the samplers the model steps read them with
``qa``            SQuAD windows over long contexts and span post-processing
================  ==============================================================

Sources: ``hub`` (needs internet or a filled cache), ``mirror`` (a folder named by
``--mirror`` / the config's ``data.mirror`` / ``$ISTAR_DATA_MIRROR``; there is no default
folder), ``auto`` (the mirror when one is named and exists, else the hub).
``istar prepare-data --task rte --out resources/data/rte`` runs :func:`prepare_task`.

May import: io, core, registry and config (the layer contract: :mod:`istar.layers`).
"""

import importlib

# Where each public name lives. The package imports them on first use (PEP 562): the model
# steps import istar.data.encoding and read splits with read_columns, and importing this
# package must not load pandas and the hub code that only `istar prepare-data` needs.
_HOMES = {
    "HUB_SOURCES": "hub", "HubUnavailableError": "hub",
    "MIRROR_ENV": "mirror", "MissingSplitError": "mirror", "IncompleteSplitError": "mirror",
    "missing_mirror_files": "mirror",
    "load_task": "prepare", "prepare_task": "prepare",
    "run_cli": "prepare",
    "read_meta": "storage", "read_split": "storage", "read_columns": "storage",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'istar.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"istar.data.{_HOMES[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
