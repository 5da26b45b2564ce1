"""The aggregate step: every study's run folders, measurements and selections collected into seven CSV files.

Each run enters under a *study* name (free text; the workflow uses ``search``, ``final``,
``lambda_sweep``, ``cosreg_means``, ``twonn``, ``layerwise``, ``zeta_sweep``,
``single_layer``, ``padding``); a run may belong to several studies. The tables and figures read only
these files, whose columns are fixed:

``runs.csv`` — one row per (study, run), columns :data:`RUNS_COLUMNS`:
    ``model`` is the short name (the path component after ``runs/`` in
    ``results/runs/{model}/{task}/{setting}/seed{seed}``, else run_config.json ``model``);
    ``setting`` the setting's folder name (``base``, ``cosreg_lam1``, ``istar_lam-1_zeta0.2``,
    ``istar_lam-1_zeta0.2_layer3``); ``method`` base / cosreg / istar; ``lam`` λ (0 for base);
    ``zeta`` ζ (empty unless istar); ``layer`` the penalised hidden state when the penalty reads
    exactly one (empty for the global penalty and for other methods); ``tokens`` the positions
    the penalty and Σ_S read (``real``, ``all_positions``; ``real`` for base); ``metric`` the task's
    headline metric and ``score`` its final value; ``accuracy`` … ``eval_loss`` the final
    evaluation's metrics (empty where the task has none); ``trivial_score`` the score of the task's
    trivial predictor on the same examples (the best constant class, the constant mean, an empty
    answer; :func:`istar.core.metrics.trivial_baseline`), ``top_label_share`` the share of the most
    frequent predicted class (classification), ``prediction_std`` the predictions' standard deviation
    (regression), ``collapsed`` whether ``score`` fails to beat ``trivial_score`` (empty, like the three
    before it, for runs evaluated before these were recorded); ``isoscore_star`` and ``isoscore``
    of the global point cloud, ``cosine_similarity`` and ``last_layer_isoscore_star`` of the last
    layer (the paper's quantity for CosReg's claim; ``layers.csv`` holds every layer) from the run's
    analysis in a measurement file (:mod:`istar.steps.measure`; empty when no file given measures
    the run, e.g. search runs), and ``analysis_zeta`` the ζ that analysis used (figures label their
    IsoScore* axes with it); ``precision`` the precision fine-tuning ran in (fp32, bf16, fp16),
    ``threads`` torch's intra-op threads in training and ``code_sha256`` the hash of the package's
    code (:func:`istar.io.provenance.package_sha256`), from run_config.json (empty for runs written
    before these were recorded).
``layers.csv`` — one row per (study, run, hidden state) of measured runs,
    columns :data:`LAYERS_COLUMNS` (``hidden_state`` 0 = embeddings … L).
``dims.csv`` — one row per (study, run, dimension) of measured runs, columns
    :data:`DIMS_COLUMNS`: per-dimension ``mean`` and ``std`` of the last layer's tokens.
``epochs.csv`` — one row per (study, run, epochs trained) of the final runs, columns
    :data:`EPOCHS_COLUMNS`: ``sigma_s_isoscore``, IsoScore of Σ_S of the model after ``epoch``
    epochs (0 = the pretrained model), and ``score``, the headline metric after that epoch
    (empty for epoch 0).
``selection.csv`` — one row per selection file (:mod:`istar.report.select`), columns
    :data:`SELECTION_COLUMNS` (``score_std`` empty for a single seed; ``protocol`` the split
    the search was scored on, see :data:`istar.report.select.PROTOCOLS`, with the held-out
    split's fraction and seed, empty under the validation protocol; ``settings`` the number
    of settings searched).
``paired.csv`` — one row per (study, measure, model, task, method ≠ base) of the study's
    confirmatory comparisons (:func:`istar.report.comparisons.study_tests`: the final study's score,
    IsoScore* and cosine similarity, the padding study's arms): the mean paired difference method −
    base over the seeds both ran, its 95 % Student-t interval, the paired t-test's and the signed-rank
    test's p-values with the seeds on each side, the Holm-adjusted p-value across the study's one
    family of tests, and the minimum detectable effect at 80 % power at α / m, columns
    :data:`istar.report.comparisons.STUDY_PAIRED_COLUMNS` (see :mod:`istar.report.paired`), then
    :data:`PAIRED_COLLAPSE_COLUMNS`: the declared rule for collapsed runs (``inference.collapsed_runs``,
    applied first: :mod:`istar.report.collapse`) and what it counted.
``trend.csv`` — the λ sweep's trends, in the same family: per model × task the slope of the score
    (points) on the fine-tuned model's IsoScore* and on λ, the seed a random intercept, columns
    :data:`istar.report.comparisons.TREND_COLUMNS`.
``pooled.csv`` — the final study's mean paired gain of each method over all cells (and per model),
    per measure, pooled by a random-effects meta-analysis in points (Hartung–Knapp–Sidik–Jonkman
    below five cells; no estimate below two), columns :data:`istar.report.paired.POOLED_COLUMNS`.
``provenance.csv`` — where each result's code came from (:mod:`istar.io.provenance`): one row
    per run folder, per measurement file and one for this aggregation (``kind`` run /
    measurement / aggregate), columns :data:`PROVENANCE_COLUMNS`: the git commit, whether the
    checkout had uncommitted changes and their hash, and the package versions; ``note`` says
    why a commit is missing (not a git checkout, or a result written before provenance was recorded).

Rows are sorted by (study, model, task, method, lam, zeta, layer, tokens, seed), empty values
first, then by setting, batch size, epochs, learning rate and folder; layers.csv and dims.csv
follow the order of runs.csv, then hidden state or dimension; selection.csv is sorted by
(model, task). Without inputs each file holds just its header. A run given twice under the
same study is counted once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from istar.io import artifacts
from istar.io.results import read_measures
from istar.registry.methods import BASELINE_METHOD, get_method
from istar.report.select import read_run

__all__ = ["aggregate", "parse_run_argument", "RUNS_COLUMNS", "LAYERS_COLUMNS", "DIMS_COLUMNS", "EPOCHS_COLUMNS",
           "SELECTION_COLUMNS", "AGGREGATE_NAMES", "PROVENANCE_COLUMNS", "PROVENANCE_NAME"]

METRIC_COLUMNS = ("accuracy", "f1", "exact_match", "matthews", "pearson", "spearman", "eval_loss")
RUN_KEYS = ("study", "model", "task", "method", "setting", "lam", "zeta", "layer", "tokens")
COLLAPSE_COLUMNS = ("trivial_score", "top_label_share", "prediction_std")
RUNS_COLUMNS = (*RUN_KEYS, "batch_size", "epochs", "learning_rate", "seed", "metric", "score", *METRIC_COLUMNS,
                *COLLAPSE_COLUMNS, "collapsed", "standin", "isoscore_star", "isoscore", "cosine_similarity",
                "last_layer_isoscore_star", "analysis_zeta", "precision", "threads", "code_sha256", "run_dir")
PAIRED_COLLAPSE_COLUMNS = ("collapse_rule", "collapsed_reference", "collapsed_method", "excluded_seeds")
"""What ``paired.csv`` adds to :data:`istar.report.paired.PAIRED_COLUMNS`: the rule for collapsed runs that
ran, how many runs of the reference and of the method collapsed, and how many seeds the rule excluded."""
LAYER_MEASURES = ("isoscore_star", "isoscore", "twonn_cls", "cosine_similarity")
LAYERS_COLUMNS = (*RUN_KEYS, "seed", "hidden_state", *LAYER_MEASURES, "standin", "analysis_zeta")
DIMS_COLUMNS = (*RUN_KEYS, "seed", "dim", "mean", "std")
EPOCHS_COLUMNS = (*RUN_KEYS, "seed", "epoch", "sigma_s_isoscore", "score")
AGGREGATE_NAMES = ("runs", "layers", "dims", "epochs", "selection", "paired", "trend", "pooled")
"""The CSV files of the aggregate step (stems), in the order they are written."""
PROVENANCE_NAME = "provenance"
"""The provenance CSV's stem (written with the aggregates; the report shows it)."""
PROVENANCE_COLUMNS = ("kind", "path", "git_commit", "git_dirty", "git_diff_sha256", "note", "istar", "torch",
                      "transformers", "accelerate", "python")
SELECTION_COLUMNS = ("model", "task", "metric", "lam", "zeta", "batch_size", "epochs", "learning_rate", "score",
                     "score_std", "seeds", "standin", "protocol", "heldout_fraction", "heldout_seed", "settings")
INTEGER_COLUMNS = ("layer", "batch_size", "epochs", "seed", "threads", "hidden_state", "dim", "seeds", "epoch",
                   "heldout_seed", "settings")
SORT_KEYS = ("study", "model", "task", "method", "lam", "zeta", "layer", "tokens", "seed", "setting", "batch_size", "epochs",
             "learning_rate", "run_dir")
NAN = float("nan")


def parse_run_argument(text: str) -> tuple[str, Path]:
    """Split a ``STUDY=RUN_DIR`` argument into (study, run folder)."""
    study, sep, run_dir = str(text).partition("=")
    if not sep or not study.strip() or not run_dir.strip():
        raise ValueError(f"cannot read run {text!r}: write STUDY=RUN_DIR, e.g. final=results/runs/bert/rte/base/seed0")
    return study.strip(), Path(run_dir.strip())


def _number(value) -> float:
    return NAN if value is None else float(value)


def _single_layer(run: dict) -> float:
    """The penalised hidden state of a run whose method takes layers and penalises exactly one, else NaN."""
    layers = run["layers"]
    if not get_method(run["method"]).takes("layers") or isinstance(layers, str) or layers is None:
        return NAN
    if isinstance(layers, int):
        return float(layers)
    return float(layers[0]) if len(layers) == 1 else NAN


def _analyses(measure_files, expected: dict | None) -> dict[Path, dict]:
    """Each measured run's analysis, keyed by its resolved folder, checked for the keys the CSVs need and
    against the analysis settings ``expected`` (:func:`istar.io.results.read_measures`)."""
    analyses = {}
    for path in measure_files:
        for run_dir, entry in read_measures(path, expected).items():
            analysis = entry["analysis"]
            missing = [key for key in ("global", "layers", "last_layer") if key not in analysis]
            if missing:
                raise ValueError(f"{path}: the analysis of {run_dir} lacks {', '.join(missing)}: "
                                 "it was not written by `istar measure`")
            analyses[Path(run_dir).resolve()] = analysis
    return analyses


def _run_row(study: str, run: dict, analysis: dict | None) -> dict:
    from istar.core.metrics import collapsed  # here: numpy stays out of the workflow's DAG build

    final = run["final"]
    row = {
        "study": study, "model": run["model"], "task": run["task"], "method": run["method"], "setting": run["setting"],
        "lam": run["lam"], "zeta": _number(run["zeta"]) if get_method(run["method"]).takes("zeta") else NAN,
        "layer": _single_layer(run), "tokens": run["tokens"], "batch_size": run["batch_size"], "epochs": run["epochs"],
        "learning_rate": run["learning_rate"], "seed": run["seed"], "metric": run["metric"],
        "score": _number(final.get(run["metric"])),
        **{name: _number(final.get(name)) for name in (*METRIC_COLUMNS, *COLLAPSE_COLUMNS)},
        "collapsed": collapsed(final, run["metric"]), "standin": run["standin"], **run["ran"], "run_dir": run["run_dir"],
    }  # the measured columns stay empty (NaN in runs.csv) without an analysis
    if analysis is not None:
        row.update(isoscore_star=_number(analysis["global"]["isoscore_star"]),
                   isoscore=_number(analysis["global"]["isoscore"]),
                   cosine_similarity=_number(analysis["layers"][-1]["cosine_similarity"]),
                   last_layer_isoscore_star=_number(analysis["layers"][-1]["isoscore_star"]),
                   analysis_zeta=_number(analysis["zeta"]))
    return row


def _sort_key(row: dict) -> tuple:
    """Sort key with empty (NaN) values first (NaN is the one value unequal to itself)."""
    return tuple((row[name] == row[name], row[name] if row[name] == row[name] else 0.0) for name in SORT_KEYS)


def _frame(rows: list[dict], columns: tuple[str, ...]):
    import pandas as pd  # here, not at the top: the workflow imports this module to build its DAG

    frame = pd.DataFrame(rows, columns=list(columns))
    frame = frame.astype({name: "Int64" for name in INTEGER_COLUMNS if name in columns})
    return frame.astype({"collapsed": "boolean"}) if "collapsed" in columns else frame


def _selection_row(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"selection file {path} does not exist: run `istar select` first")
    selection = artifacts.read_json(path)  # its content hash, when `istar select` recorded one
    missing = [name for name in SELECTION_COLUMNS if name not in selection]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by `istar select`")
    row = {name: selection[name] for name in SELECTION_COLUMNS}
    row.update(zeta=_number(row["zeta"]), score=_number(row["score"]), score_std=_number(row["score_std"]), standin=bool(row["standin"]),
               heldout_fraction=_number(row["heldout_fraction"]))
    return row


def _provenance_row(kind: str, path, recorded: dict | None) -> dict:
    if recorded is None:
        return {"kind": kind, "path": str(path), "note": "not recorded (written before provenance was recorded)"}
    git, versions = recorded["git"], recorded["versions"]
    return {"kind": kind, "path": str(path), "git_commit": git["commit"], "git_dirty": git.get("dirty"),
            "git_diff_sha256": git.get("diff_sha256"), "note": git.get("note"),
            **{name: versions.get(name) for name in PROVENANCE_COLUMNS[6:]}}


def _provenance_rows(run_dirs, measure_files, out_dir) -> list[dict]:
    """provenance.csv: each distinct run folder, each measurement file, then this aggregation."""
    from istar.io.provenance import code_provenance

    return ([_provenance_row("run", run_dir, artifacts.read_json(Path(run_dir) / "run_config.json").get("provenance"))
             for run_dir in dict.fromkeys(str(d) for d in run_dirs)]
            + [_provenance_row("measurement", path, artifacts.read_json(path).get("provenance"))
               for path in measure_files]
            + [_provenance_row("aggregate", out_dir, code_provenance())])


def _with_collapse_counts(paired, counts, rule: str):
    """``paired`` with :data:`PAIRED_COLLAPSE_COLUMNS`, from :func:`istar.report.collapse.apply_collapse_rule`'s counts
    (a seed the rule excludes leaves every arm, so the reference's count of excluded runs is the cell's)."""

    cell = ["study", "model", "task"]
    reference = counts.loc[counts["method"] == BASELINE_METHOD, [*cell, "collapsed", "excluded"]].rename(
        columns={"collapsed": "collapsed_reference", "excluded": "excluded_seeds"})
    method = counts[[*cell, "method", "collapsed"]].rename(columns={"collapsed": "collapsed_method"})
    merged = paired.merge(reference, on=cell, how="left").merge(method, on=[*cell, "method"], how="left")
    counted = ["collapsed_reference", "collapsed_method", "excluded_seeds"]
    merged[counted] = merged[counted].fillna(0).astype(int)
    return merged.assign(collapse_rule=rule)[[*paired.columns, *PAIRED_COLLAPSE_COLUMNS]]


def aggregate(study_runs, selection_files, out_dir, measure_files=(), inference: dict | None = None,
              analysis: dict | None = None) -> dict:
    """Collect runs and selections into ``runs.csv``, ``layers.csv``, ``dims.csv``, ``epochs.csv``, ``selection.csv``,
    ``paired.csv``, ``trend.csv`` and ``pooled.csv``, and where their code came from into ``provenance.csv``.

    Parameters
    ----------
    study_runs : sequence of (study, run folder); every folder must hold metrics.json and
        run_config.json (a finished run).
    selection_files : sequence of ``best.json`` files written by :func:`istar.report.select.select_best`.
    out_dir : folder for the CSV files (created; each written atomically).
    inference : the config's ``inference`` section (a key left out, or None: the schema's default):
        ``collapsed_runs`` (:mod:`istar.registry.collapse_rules`), applied to the runs before ``paired.csv``,
        ``trend.csv`` and ``pooled.csv`` (:func:`istar.report.collapse.apply_collapse_rule`; runs.csv keeps
        every run, flagged); ``multiplicity`` and ``primary``, the family's adjustment; ``paper_models``,
        model → the paper's model whose Table 1 cells ``paired.csv`` sets beside its cells
        (:func:`istar.report.comparisons.study_tests`).
    measure_files : files written by :func:`istar.steps.measure.measure_runs`; a run found in one
        of them gets its analysis (a run in several files: the last one given; measurements of
        one model agree up to floating-point noise). Keys are run folders as the measurement
        recorded them, compared after resolving, so give the same working directory.
    analysis : the analysis settings every measurement must have been made with (``zeta``,
        ``sigma_s_model``: the config's ``analysis`` section); None: not checked.

    Returns
    -------
    dict with keys :data:`AGGREGATE_NAMES` and ``provenance``: the DataFrames written, with
    the columns of the module docstring (integer columns as nullable ``Int64``).
    """
    from istar.config.schema import default_of

    # here: pandas and SciPy stay out of the workflow's DAG build
    from .collapse import apply_collapse_rule
    from .comparisons import study_tests
    from .paired import pooled_gains

    analyses = _analyses(measure_files, analysis)
    seen, entries = set(), []
    for study, run_dir in study_runs:
        run_dir = Path(run_dir)
        if (study, run_dir.resolve()) in seen:
            continue
        seen.add((study, run_dir.resolve()))
        try:
            run = read_run(run_dir)
        except artifacts.DamagedArtifactError:
            raise  # it names the file and the command that rebuilds it
        except (ValueError, FileNotFoundError) as error:
            raise type(error)(f"study {study}: {error}") from None
        analysis = analyses.get(run_dir.resolve())
        entries.append((_run_row(study, run, analysis), analysis, run))
    entries.sort(key=lambda entry: _sort_key(entry[0]))
    layer_rows, dim_rows, epoch_rows = [], [], []
    for row, analysis, run in entries:
        keys = {name: row[name] for name in (*RUN_KEYS, "seed")}  # what names a run in the other CSVs
        if row["study"] == "final":
            scores = [NAN] + [_number(entry.get(run["metric"])) for entry in run["history"]]
            epoch_rows.extend({**keys, "epoch": epoch, "sigma_s_isoscore": float(value),
                               "score": scores[epoch] if epoch < len(scores) else NAN}
                              for epoch, value in enumerate(run["sigma_s_isoscore"]))
        if analysis is None:
            continue
        layer_rows.extend({**keys, "hidden_state": layer["layer"], **{key: _number(layer[key]) for key in LAYER_MEASURES},
                           "standin": row["standin"], "analysis_zeta": row["analysis_zeta"]}
                          for layer in analysis["layers"])
        last = analysis["last_layer"]
        dim_rows.extend({**keys, "dim": dim, "mean": float(mean), "std": float(std)}
                        for dim, (mean, std) in enumerate(zip(last["mean"], last["std"], strict=True)))
    selection_rows = sorted((_selection_row(Path(path)) for path in selection_files),
                            key=lambda row: (row["model"], row["task"]))
    runs_frame = _frame([row for row, _, _ in entries], RUNS_COLUMNS)
    collapse_rule = (inference or {}).get("collapsed_runs") or default_of("inference.collapsed_runs")
    kept, counts = apply_collapse_rule(runs_frame, collapse_rule)
    tests = study_tests(kept, inference)
    paired = _with_collapse_counts(tests.paired, counts, collapse_rule)
    final = tests.paired[tests.paired["study"] == "final"]
    frames = dict(zip(AGGREGATE_NAMES, (
        runs_frame, _frame(layer_rows, LAYERS_COLUMNS), _frame(dim_rows, DIMS_COLUMNS),
        _frame(epoch_rows, EPOCHS_COLUMNS), _frame(selection_rows, SELECTION_COLUMNS),
        paired, tests.trends, pooled_gains(final)), strict=True))
    frames[PROVENANCE_NAME] = _frame(_provenance_rows([entry[2]["run_dir"] for entry in entries], measure_files,
                                                      out_dir), PROVENANCE_COLUMNS)
    out_dir = Path(out_dir)
    for name, frame in frames.items():
        artifacts.write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))
    return frames


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", required=True,
                        help="folder for runs.csv, layers.csv, dims.csv, epochs.csv, selection.csv, paired.csv, "
                             "trend.csv, pooled.csv, provenance.csv")
    parser.add_argument("--selection", action="extend", nargs="*", default=[], metavar="BEST_JSON",
                        help="selection files written by `istar select`")
    parser.add_argument("--measures", action="extend", nargs="*", default=[], metavar="MEASURES_JSON",
                        help="measurement files written by `istar measure` (the runs' analyses)")
    parser.add_argument("--inference", type=json.loads, default=None, metavar="JSON",
                        help="the config's inference section as JSON: the rule for collapsed runs, the multiplicity "
                             "plan, the primary endpoint and the paper models, e.g. '{\"collapsed_runs\": \"keep\", "
                             "\"multiplicity\": \"family\"}' (a key left out: the schema's default)")
    parser.add_argument("--analysis", type=json.loads, default=None, metavar="JSON",
                        help="the analysis settings every measurement must have been made with, e.g. "
                             "'{\"zeta\": 0.2, \"sigma_s_model\": \"pretrained\"}' (default: not checked)")
    parser.add_argument("runs", nargs="*", metavar="STUDY=RUN_DIR", help="a finished run folder and its study")


def run_cli(args) -> int:
    # `--selection a.json final=DIR` hands the STUDY=RUN_DIR arguments to the option before them: move them back.
    def files(items):
        return [item for item in items if "=" not in item or Path(item).is_file()]

    selection, measures = files(args.selection), files(args.measures)
    arguments = [item for item in args.selection + args.measures if item not in selection + measures] + list(args.runs)
    frames = aggregate([parse_run_argument(argument) for argument in arguments], selection, args.out_dir, measures,
                       inference=args.inference, analysis=args.analysis)
    print(", ".join(f"{name}.csv: {len(frame):,} rows" for name, frame in frames.items()) + f" -> {args.out_dir}")
    return 0
