"""The held-out selection split: a prepared task's training rows cut in two, ``istar holdout-data``.

Under ``search.selection_split: heldout`` the search must not be scored on the validation split
that Table 1 reports. This step cuts the prepared training split (``DATA/train.parquet``) into

- ``OUT/train.parquet``: the rows the search trains on (and takes Σ_S from), and
- ``OUT/validation.parquet``: the held-out rows that score it, a seeded ``fraction`` of them,

so that every search step reads ``OUT`` exactly as it would read a prepared task folder. The
two parts are disjoint and together are the training split, each in its original order.
SQuAD is cut by article (``title``): the questions of one article share its paragraphs, so
holding out questions alone would let the search train on the contexts it is scored on. The
other tasks are cut by row. The draw is ``fraction`` × (rows or articles), rounded, at least
one and at most all but one, without replacement from ``numpy.random.default_rng((seed, 3))``.

``OUT/meta.json`` is the source folder's, with ``rows`` and ``labels`` of the two parts and a
``heldout`` record: ``{"of", "of_train_sha256", "fraction", "seed", "unit", "held_out",
"units"}`` (``held_out`` of ``units`` rows or articles). Training steps copy ``meta.json`` into
``run_config.json``, which is how :func:`istar.report.select.select_best` knows the protocol.
The final runs keep training on ``DATA``, the full training split.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from istar import __version__
from istar.data.prepare import label_summary
from istar.data.storage import read_meta, read_split, write_prepared
from istar.registry.tasks import get_task

__all__ = ["HOLDOUT_STREAM", "holdout_split", "add_cli_arguments", "run_cli"]

HOLDOUT_STREAM = 3
"""The random stream of the held-out draw (prepare-data's subsampling uses 1 and 2 with the data seed)."""


def holdout_split(data_dir, out_dir, fraction: float, seed: int) -> dict:
    """Cut ``data_dir``'s training split into the search's training part and its held-out part.

    Parameters
    ----------
    data_dir : a folder written by :func:`istar.data.prepare_task`.
    out_dir : the folder to write (``train.parquet``, ``validation.parquet``, ``meta.json``).
    fraction : share of the rows (SQuAD: articles) held out, in (0, 0.5].
    seed : integer >= 0, the draw's seed.

    Returns
    -------
    The ``meta.json`` written (see the module docstring).
    """
    if not 0 < fraction <= 0.5:
        raise ValueError(f"the held-out fraction must be in (0, 0.5], got {fraction!r} (search.heldout_fraction)")
    parent = read_meta(data_dir)
    task = get_task(parent["task"])
    train = read_split(data_dir, "train")
    unit = "article" if task.kind == "qa" else "row"
    keys = train["title"].to_numpy() if task.kind == "qa" else np.arange(len(train))
    units = list(dict.fromkeys(keys.tolist()))
    if len(units) < 2:
        raise ValueError(f"{data_dir}/train.parquet has {len(units)} {unit}(s): a held-out split needs at least two; "
                         "raise data.max_train_samples or use search.selection_split: validation")
    count = min(max(1, round(fraction * len(units))), len(units) - 1)
    rng = np.random.default_rng((seed, HOLDOUT_STREAM))
    chosen = {units[i] for i in rng.choice(len(units), size=count, replace=False)}
    held = np.fromiter((key in chosen for key in keys.tolist()), dtype=bool, count=len(keys))
    parts = {"train": train[~held].reset_index(drop=True), "validation": train[held].reset_index(drop=True)}
    inherited = {k: v for k, v in parent.items() if k not in ("rows", "labels", "split_sha256", "created", "istar_version")}
    meta = {
        **inherited,
        "rows": {split: len(frame) for split, frame in parts.items()},
        "labels": {split: label_summary(frame, task) for split, frame in parts.items()},
        "heldout": {"of": str(data_dir), "of_train_sha256": parent.get("split_sha256", {}).get("train.parquet"),
                    "fraction": fraction, "seed": seed, "unit": unit, "held_out": count, "units": len(units)},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "istar_version": __version__,
    }
    write_prepared(out_dir, task, parts, meta)
    return meta


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``holdout-data`` options, generated from :class:`istar.config.specs.HoldoutSpec`."""
    from istar.config.specs import HoldoutSpec, add_spec_arguments

    add_spec_arguments(parser, HoldoutSpec)


def run_cli(args: argparse.Namespace) -> int:
    from istar.config.specs import spec_from_cli

    spec = spec_from_cli(args)
    meta = holdout_split(spec.data_dir, spec.out, spec.fraction, spec.seed)
    heldout = meta["heldout"]
    print(f"{meta['task']}: {meta['rows']['validation']:,} of {meta['rows']['validation'] + meta['rows']['train']:,} "
          f"training rows held out ({heldout['held_out']} of {heldout['units']} {heldout['unit']}s, seed "
          f"{heldout['seed']}) -> {Path(spec.out)}")
    return 0
