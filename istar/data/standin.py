"""Stand-in splits: when the mirror lacks one split of a task, divide the other one (opt-in, flagged).

A stand-in validation part is drawn with a seed from the available split (SQuAD by article, so
no context is in both parts); ``meta.json`` says ``"standin": true`` and results on it are not
comparable with published scores (docs/method.md §6).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from istar.data.hub import HUB_DATASETS
from istar.registry.tasks import Task

__all__ = ["standin_split", "missing_split_message"]


def missing_split_message(task: Task, root: Path, files: dict[str, str], missing: list[str],
                          available: str | None, standin_fraction: float, seed: int) -> str:
    """The text of :class:`istar.data.MissingSplitError`: what is missing, where, and the options.

    ``files`` maps each split to its release file relative to ``root``.
    """
    paths = " and ".join(str(root / files[split]) for split in missing)
    head = (
        f"{task.display}: the {' and '.join(missing)} split"
        f"{'s are' if len(missing) > 1 else ' is'} not in the mirror; expected {paths} (the "
        f"public release's file name and layout)."
    )
    hub = (f"use the Hugging Face hub on a machine with internet (`--source hub`; dataset "
           f"{HUB_DATASETS[task.key][0]})")
    if available is None:
        return (f"{head} A stand-in needs at least one of the splits, so none is possible. "
                f"Options: put the release files there; or {hub}.")
    standin = (
        f"opt into a stand-in with `--allow-standin` (allow_standin=True): the {available} "
        f"file {root / files[available]} is split with seed {seed} into a "
        f"stand-in train part ({1 - standin_fraction:.0%}) and a stand-in validation part "
        f"({standin_fraction:.0%})"
        + (", by article title so no context is in both" if task.kind == "qa" else "")
        + "; meta.json then says \"standin\": true, and scores are not comparable with "
        "published ones"
    )
    return f"{head} Options: put the release file there; or {hub}; or {standin}."


def standin_split(frame: pd.DataFrame, task: Task, fraction: float,
                   seed: int) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Split one split into a stand-in train part and a stand-in validation part.

    About ``fraction`` of the rows go to the validation part: chosen at random (seeded)
    for classification and regression; for SQuAD whole articles (``title``) are drawn in a
    seeded random order until the part holds ``fraction`` of the questions. Both parts keep
    the original row order. Returns (train part, validation part, a sentence describing it).
    """
    rng = np.random.default_rng((seed, 0))
    if task.kind == "qa":
        titles = frame["title"].unique()
        if len(titles) < 2:
            raise ValueError(f"{task.display}: a stand-in split by title needs two or more "
                             f"articles, found {len(titles)}")
        sizes = frame["title"].value_counts()
        held, chosen = 0, []
        for title in titles[rng.permutation(len(titles))][:-1]:
            if held >= fraction * len(frame):
                break
            chosen.append(title)
            held += int(sizes[title])
        in_validation = frame["title"].isin(chosen).to_numpy()
        how = (f"whole articles drawn at random by title: {len(titles) - len(chosen)} for "
               f"train, {len(chosen)} for validation, so no context is in both")
    else:
        if len(frame) < 2:
            raise ValueError(f"{task.display}: a stand-in split needs two or more rows, "
                             f"found {len(frame)}")
        n_validation = min(max(1, round(fraction * len(frame))), len(frame) - 1)
        in_validation = np.zeros(len(frame), dtype=bool)
        in_validation[rng.choice(len(frame), size=n_validation, replace=False)] = True
        how = "rows drawn at random"
    train = frame.loc[~in_validation].reset_index(drop=True)
    validation = frame.loc[in_validation].reset_index(drop=True)
    return train, validation, how

