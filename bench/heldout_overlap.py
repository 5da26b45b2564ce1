"""Measurement: what the held-out selection rows share with the search's training rows, cut by row
and cut by group (istar.data.holdout). Results go to docs/method.md §6.

Run with ``python -m bench.heldout_overlap [--mirror DIR] [--subset] [--fraction 0.2] [--seed 0]``.
``--mirror`` defaults to the full release (:func:`bench.full_mirror`); ``--mirror tests/data
--subset`` measures the test data. For every task whose training file the mirror holds:

- *by row*: the cut this project made before the grouping (a seeded ``fraction`` of the rows,
  drawn as ``istar holdout-data`` drew them: ``default_rng((seed, 3)).choice(rows, round(fraction · rows))``);
- *grouped*: ``istar holdout-data`` as it is (:func:`istar.data.holdout.holdout_split`);

each measured with :func:`istar.data.holdout.heldout_overlap`, plus the grouped cut's row counts
(held out, left to the search, dropped on both sides), its groups and its time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def row_cut(train, fraction: float, seed: int):
    """The cut by row: (search-training rows, held-out rows)."""
    from istar.data.holdout import HOLDOUT_STREAM

    count = min(max(1, round(fraction * len(train))), len(train) - 1)
    held = np.zeros(len(train), dtype=bool)
    held[np.random.default_rng((seed, HOLDOUT_STREAM)).choice(len(train), size=count, replace=False)] = True
    return train[~held], train[held]


def main(argv=None) -> None:
    from bench import full_mirror
    from istar.data import prepare_task, read_split
    from istar.data.holdout import heldout_overlap, holdout_split
    from istar.data.mirror import mirror_file
    from istar.registry.tasks import TASKS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=None, help="a release folder (default: the full release)")
    parser.add_argument("--subset", action="store_true", help="the mirror holds part of each release (tests/data)")
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    mirror = args.mirror or full_mirror()
    print(f"mirror {mirror}, fraction {args.fraction}, seed {args.seed}")
    print("| task | training rows | by row: overlap | grouped: overlap | groups held out | held out | search | dropped | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for key, task in TASKS.items():
            if not (mirror / mirror_file(key, "train")).is_file():
                continue
            data = Path(tmp) / key
            prepare_task(key, data, source="mirror", mirror=mirror, subset=args.subset)
            train = read_split(data, "train")
            before = heldout_overlap(*row_cut(train, args.fraction, args.seed), task)
            started = time.perf_counter()
            record = holdout_split(data, data / "heldout", args.fraction, args.seed)["heldout"]
            seconds = time.perf_counter() - started
            after, rows = record["overlap"], record["rows"]

            def share(o):
                return f"{o['found']:,} / {o['checked']:,} ({o['share']:.1%})" if o["checked"] else "0 / 0"

            print(f"| {task.display} | {len(train):,} | {share(before)} | {share(after)} | {record['held_out']:,} of "
                  f"{record['units']:,} {record['unit']}s | {rows['held_out']:,} | {rows['search_train']:,} | "
                  f"{rows['dropped']:,} | {seconds:.1f} |")
            if key == "sst2":
                held = read_split(data / "heldout", "validation")["text_a"].str.split().map(len)
                print(f"  (SST-2 held-out rows: median {held.median():.0f} words; full sentences held out: "
                      f"{record['held_out']:,})")
    print("overlap: single-sentence tasks, held-out rows of 5+ words inside a training row; "
          "pairs, held-out sentences in a training pair")


if __name__ == "__main__":
    main()
