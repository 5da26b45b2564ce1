"""Isotropy profiles collected into CSVs: a row per model × revision × measured matrix or layer,
and the embedding matrices' 2-D projections (a row per drawn point).

``istar survey-aggregate results/profile/*/*.json --out results/aggregate/profiles.csv
--projections-out results/aggregate/profile_projections.csv``.
The model's short name and the revision label come from the workflow's layout
(``results/profile/{model}/{revision}.json``); a revision named ``stepN`` (Pythia's training
checkpoints) is placed at training step N (column ``step``, empty otherwise).

Columns: ``model``, ``revision``, ``step``, ``parameters``, ``num_layers``, ``hidden_size``,
``kind`` (``input_embeddings``, ``output_embeddings``, ``layer`` or ``pre_final_norm``),
``layer`` (hidden-state index, 0 = embeddings; the pre-norm row carries L), ``depth``
(layer / L), the measures of :mod:`istar.steps.survey` (empty where a kind has none) and
``final_norm_gain_cv`` (the spread of the final norm's gain, per profile). The two I(W)
definitions are ``partition_isotropy_both_signs`` and ``partition_isotropy_solver_signs`` (the
NAACL paper's), each also ``_centred``; ``solver_signs_fp32_overflow`` says where the authors'
plain float32 exp would have overflowed.

The projections CSV (:data:`PROJECTION_COLUMNS`): ``model``, ``revision``, ``step``,
``parameters``, ``matrix`` (``input``/``output``), ``centred`` (bool), ``rows`` (V),
``sampled_rows``, ``x``, ``y``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from istar.io import artifacts

__all__ = ["PROFILE_COLUMNS", "PROJECTION_COLUMNS", "MEASURES", "revision_step", "profile_rows", "projection_rows",
           "aggregate_profiles", "aggregate_projections"]

MEASURES = ("isoscore", "isoscore_star", "partition_isotropy_both_signs", "partition_isotropy_both_signs_centred",
            "partition_isotropy_solver_signs", "partition_isotropy_solver_signs_centred",
            "solver_signs_max_exponent", "solver_signs_max_exponent_centred", "solver_signs_fp32_overflow",
            "solver_signs_fp32_overflow_centred", "average_cosine", "average_cosine_centred", "mean_norm",
            "effective_rank", "twonn", "twonn_tokens", "top1_dim_variance_share", "top10_dim_variance_share",
            "top1_pc_variance_share", "outlier_dims", "tokens")
PROFILE_COLUMNS = ("model", "revision", "step", "parameters", "num_layers", "hidden_size", "kind", "layer", "depth",
                   *MEASURES, "final_norm_gain_cv")
PROJECTION_COLUMNS = ("model", "revision", "step", "parameters", "matrix", "centred", "rows", "sampled_rows", "x", "y")
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


def projection_rows(profile: dict, model: str, revision: str) -> list[dict]:
    """The projections-CSV rows (dicts with :data:`PROJECTION_COLUMNS`) of one profile JSON."""
    common = {"model": model, "revision": revision, "step": revision_step(revision),
              "parameters": profile["provenance"]["parameters"]}
    rows = []
    for matrix, entry in profile["projections"].items():
        for centred in (False, True):
            points = entry["centred" if centred else "raw"]
            rows += [{**common, "matrix": matrix, "centred": centred, "rows": entry["rows"],
                      "sampled_rows": entry["sampled_rows"], "x": x, "y": y} for x, y in zip(points["x"], points["y"])]
    return rows


def _frame(paths, rows_of, columns, order):
    import pandas as pd

    rows = []
    for path in map(Path, paths):
        rows += rows_of(artifacts.read_json(path), model=path.parent.name, revision=path.stem)
    frame = pd.DataFrame(rows, columns=list(columns))
    frame = frame.astype({column: "Int64" for column in ("step", "layer") if column in columns})
    return frame.sort_values(order, kind="stable", na_position="last")


def aggregate_profiles(paths):
    """A DataFrame of every profile JSON in ``paths`` (``…/{model}/{revision}.json``), sorted."""
    return _frame(paths, profile_rows, PROFILE_COLUMNS, ["model", "step", "revision", "kind", "layer"])


def aggregate_projections(paths):
    """The projections of every profile JSON in ``paths``, one row per drawn point."""
    return _frame(paths, projection_rows, PROJECTION_COLUMNS, ["model", "step", "revision", "matrix", "centred"])


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", nargs="+", type=Path, help="profile JSONs, laid out as …/MODEL/REVISION.json")
    parser.add_argument("--out", type=Path, required=True, help="the CSV of the measures to write")
    parser.add_argument("--projections-out", type=Path, required=True,
                        help="the CSV of the embedding matrices' 2-D projections to write")


def run_cli(args) -> int:
    for aggregate, out in ((aggregate_profiles, args.out), (aggregate_projections, args.projections_out)):
        frame = aggregate(args.profiles)
        artifacts.write_text(out, frame.to_csv(index=False))
        print(f"{len(args.profiles)} profile(s), {len(frame)} rows -> {out}")
    return 0
