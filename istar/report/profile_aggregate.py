"""Isotropy profiles collected into one CSV: a row per model × revision × measured matrix or layer.

``istar profile-aggregate results/profile/*/*.json --out results/aggregate/profiles.csv``.
The model's short name and the revision label come from the workflow's layout
(``results/profile/{model}/{revision}.json``); a revision named ``stepN`` (Pythia's training
checkpoints) is placed at training step N (column ``step``, empty otherwise).

Columns: ``model``, ``revision``, ``step``, ``parameters``, ``num_layers``, ``hidden_size``,
``kind`` (``input_embeddings``, ``output_embeddings``, ``layer`` or ``pre_final_norm``),
``layer`` (hidden-state index, 0 = embeddings; the pre-norm row carries L), ``depth``
(layer / L), the measures of :mod:`istar.steps.profile` (empty where a kind has none) and
``final_norm_gain_cv`` (the spread of the final norm's gain, per profile).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from istar.io import artifacts

__all__ = ["PROFILE_COLUMNS", "MEASURES", "revision_step", "profile_rows", "aggregate_profiles"]

MEASURES = ("isoscore", "isoscore_star", "partition_isotropy", "partition_isotropy_centred", "average_cosine",
            "average_cosine_centred", "mean_norm", "top1_dim_variance_share", "top10_dim_variance_share",
            "top1_pc_variance_share", "outlier_dims", "tokens")
PROFILE_COLUMNS = ("model", "revision", "step", "parameters", "num_layers", "hidden_size", "kind", "layer", "depth",
                   *MEASURES, "final_norm_gain_cv")
STEP = re.compile(r"step(\d+)")


def revision_step(revision: str) -> int | None:
    """Training step N of a revision named ``stepN`` (Pythia's checkpoints), else None."""
    match = STEP.fullmatch(revision)
    return int(match.group(1)) if match else None


def profile_rows(profile: dict, model: str, revision: str) -> list[dict]:
    """The CSV rows (dicts with :data:`PROFILE_COLUMNS`) of one profile JSON."""
    provenance = profile["provenance"]
    depth = provenance["num_layers"]
    gain = profile.get("final_norm_gain") or {}
    common = {"model": model, "revision": revision, "step": revision_step(revision),
              "parameters": provenance["parameters"], "num_layers": depth, "hidden_size": provenance["hidden_size"],
              "final_norm_gain_cv": gain.get("coefficient_of_variation")}
    rows = [{**common, "kind": f"{which}_embeddings", "layer": None, "depth": None, **measures}
            for which, measures in profile["static"].items()]
    for entry in profile["layers"]:
        before_norm = entry["layer"] == "pre_final_norm"
        layer = depth if before_norm else int(entry["layer"])
        rows.append({**common, "kind": "pre_final_norm" if before_norm else "layer", "layer": layer,
                     "depth": layer / depth, **{k: v for k, v in entry.items() if k != "layer"}})
    return [{column: row.get(column) for column in PROFILE_COLUMNS} for row in rows]


def aggregate_profiles(paths):
    """A DataFrame of every profile JSON in ``paths`` (``…/{model}/{revision}.json``), sorted."""
    import pandas as pd

    rows = []
    for path in map(Path, paths):
        rows += profile_rows(artifacts.read_json(path), model=path.parent.name, revision=path.stem)
    frame = pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
    frame["step"] = frame["step"].astype("Int64")
    frame["layer"] = frame["layer"].astype("Int64")
    return frame.sort_values(["model", "step", "revision", "kind", "layer"], kind="stable", na_position="last")


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", nargs="+", type=Path, help="profile JSONs, laid out as …/MODEL/REVISION.json")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")


def run_cli(args) -> int:
    frame = aggregate_profiles(args.profiles)
    artifacts.write_text(args.out, frame.to_csv(index=False))
    print(f"{len(args.profiles)} profile(s), {len(frame)} rows -> {args.out}")
    return 0
