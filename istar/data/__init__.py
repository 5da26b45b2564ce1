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
``mirror``        the offline mirror folder: layout, loading, file checksums
``hub``           the ``datasets`` library: hub ids, configs, column mapping
``standin``       a seeded stand-in split when the mirror lacks one split
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

Layer: may import io, core, registry and config.
"""

from istar.data.hub import HUB_DATASETS, HubUnavailableError
from istar.data.mirror import MIRROR_ENV, MissingSplitError, missing_mirror_files
from istar.data.prepare import SOURCES, add_cli_arguments, load_task, prepare_task, run_cli
from istar.data.storage import read_meta, read_split

__all__ = [
    "SOURCES",
    "MIRROR_ENV",
    "HUB_DATASETS",
    "MissingSplitError",
    "HubUnavailableError",
    "load_task",
    "prepare_task",
    "read_split",
    "read_meta",
    "missing_mirror_files",
    "add_cli_arguments",
    "run_cli",
]
