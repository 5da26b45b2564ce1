"""The search stage of the paper's protocol: the best hyperparameter setting of one model × task.

Every run folder (``metrics.json`` + ``run_config.json``, see :mod:`istar.steps.train`) belongs to a
*setting* (method, λ, ζ, layers, batch size, epochs, learning rate) and a seed. Runs of the
same setting are averaged over their seeds; the setting with the highest mean of the task's
headline metric wins (higher is better for every metric of :mod:`istar.registry.tasks`). Ties go to
the smaller |λ|, then the smaller ζ (none counts as 0), then the setting given first.
A mean that is NaN ranks last. Output (``best.json``)::

    {"model", "task", "metric", "method", "lam", "zeta", "layers", "batch_size", "epochs",
     "learning_rate", "score", "score_std", "seeds", "standin", "protocol", "heldout_fraction",
     "heldout_seed", "settings", "baselines",
     "candidates": [{"method", "lam", "zeta", "layers", "batch_size", "epochs",
                     "learning_rate", "score", "score_std", "seeds", "runs"}, ...]}

``baselines`` maps each other method searched beside I-STAR (``search.tune_baselines``) to its own
best setting (the :data:`SETTING_KEYS`, ``score``, ``seeds``); empty otherwise. The top-level choice
is always I-STAR's when I-STAR was searched. ``score`` is the mean over seeds of the final metric, ``score_std`` its sample standard
deviation (divide by seeds − 1; ``null`` for one seed); ``candidates`` lists every setting,
best first, with its run folders; ``settings`` counts them. ``model`` is the model's short
name (the folder after ``runs/`` or ``search/`` in the workflow's layout ``…/{model}/{task}/{setting}/seed{n}``,
else run_config.json's ``model``).

``protocol`` (a key of :data:`PROTOCOLS`) says which rows the search was scored on. It is
read from the runs themselves, not from an option: each run's ``run_config.json`` holds the
``meta.json`` of the data it trained and was evaluated on, and a held-out split made by
:mod:`istar.data.holdout` records there its fraction and seed (``heldout_fraction``,
``heldout_seed``; ``null`` under the validation protocol). Runs of both kinds mixed are an
error.

Under the confirmatory protocol (config ``final.istar``) I-STAR is not searched: :func:`fixed_choice`
writes the same file for the λ and ζ fixed in advance, with ``protocol`` ``"fixed"`` and no score.
Its ``settings``, ``candidates`` and held-out split are those of the baselines' search where
``search.tune_baselines`` tunes them against the fixed I-STAR, else 0, none and None.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from istar.config.layout import parse_run_dir, seed_of
from istar.io import artifacts
from istar.io.results import read_finished_run
from istar.registry import lookup
from istar.registry.methods import BASELINE_METHOD, SEARCHED_METHOD

__all__ = ["read_run", "select_best", "fixed_choice", "SETTING_KEYS", "PROTOCOLS",
           "protocol_note", "selection_note"]

SETTING_KEYS = ("method", "lam", "zeta", "layers", "tokens", "batch_size", "epochs", "learning_rate")
"""What defines a setting: runs that agree on all of these differ only by their seed."""


@dataclass(frozen=True)
class Protocol:
    """A way of scoring the search, and the sentence the tables print about it.

    ``note`` is formatted with ``settings`` (how many settings were searched), ``fraction``
    and ``seed`` (the held-out split's, when there is one).
    """

    key: str
    note: str
    tuned_baselines_note: str | None = None
    """The note instead where the baselines' training values were searched beside it (``settings`` > 0),
    formatted with ``settings`` and ``rows`` (the rows that search was scored on)."""


PROTOCOLS: dict[str, Protocol] = {protocol.key: protocol for protocol in (
    Protocol("validation", "λ and ζ were chosen on the validation split that the table reports (the paper's "
             "protocol): the I-STAR row is the best of {settings} searched settings scored on the very rows it is "
             "reported on, so it is biased upward (selection bias), and more so the more settings are searched and "
             "the smaller the split."),
    Protocol("heldout", "λ and ζ were chosen on a held-out {fraction:.0%} of the training split (seed {seed}), cut "
             "by groups so that no sentence of a held-out row is in a row the search trained on; the {settings} "
             "searched settings trained on the rest, and the final runs on the full training split. The validation "
             "split the table reports took no part in the choice."),
    Protocol("fixed", "λ and ζ were fixed in advance for each model and task (the confirmatory protocol, config "
             "final.istar), with no search here: no selection bias from this study and no tuning advantage over "
             "Base (values taken from a paper were chosen there, possibly on the same dev sets: less bias, not none).",
             "λ and ζ were fixed in advance for each model and task (the confirmatory protocol, config final.istar) "
             "and I-STAR trained at the training section's values, while each baseline trained at the best of its "
             "{settings} searched training settings, scored on {rows} (search.tune_baselines): the tuning advantage "
             "is the baselines', so a gain of I-STAR is conservative."),
)}
"""The selection protocols (search.selection_split in the config), keyed as best.json records them."""


def protocol_note(protocol: str, *, settings, fraction: float | None = None, seed: int | None = None) -> str:
    """The tables' sentence about ``protocol`` (a key of :data:`PROTOCOLS`)."""
    chosen = lookup(PROTOCOLS, protocol, "selection protocol",
                    "in selection.csv: rerun `istar select` and `istar aggregate`")
    if chosen.tuned_baselines_note and str(settings) != "0":
        rows = ("the validation split the table reports (so the baselines' scores are biased upward)" if fraction is None
                else f"a held-out {float(fraction):.0%} of the training split (seed {int(seed)})")
        return chosen.tuned_baselines_note.format(settings=settings, rows=rows)
    return chosen.note.format(settings=settings, fraction=fraction, seed=seed)


def selection_note(rows) -> str:
    """:func:`protocol_note` for the rows of ``selection.csv`` (a DataFrame) of one protocol: the settings searched
    (a range where the cells searched different numbers), the held-out split's fraction and seed."""
    import pandas as pd  # here: the workflow imports this module to build its DAG

    settings, first = rows["settings"].astype(int), rows.iloc[0]
    return protocol_note(first["protocol"], settings="–".join(map(str, sorted({settings.min(), settings.max()}))),
                         fraction=None if pd.isna(first["heldout_fraction"]) else float(first["heldout_fraction"]),
                         seed=None if pd.isna(first["heldout_seed"]) else int(first["heldout_seed"]))


def read_run(run_dir) -> dict:
    """The description of a finished run folder.

    Parameters
    ----------
    run_dir : a folder written by :func:`istar.steps.train.train`, checked by
        :func:`istar.io.results.read_finished_run` (content hashes, one run's outputs).

    Returns
    -------
    dict with ``run_dir`` (str), ``model`` (short name), ``task``, ``setting`` (folder name),
    the :data:`SETTING_KEYS`, ``tokens`` (the penalty's token selection), ``seed``, ``metric`` (the task's headline metric), ``final``
    (the final evaluation's metrics, dict), ``standin`` (bool), ``history`` (the evaluation
    after each epoch), ``sigma_s_isoscore`` (IsoScore of Σ_S after 0, 1, … epochs; empty
    for runs written before it was recorded) and ``heldout`` (the ``heldout`` record of the
    data's meta.json when the run trained on a held-out split of :mod:`istar.data.holdout`,
    else None) and ``ran``: what ran, ``precision`` (effective), ``threads`` and ``code_sha256``
    (each None for runs written before it was recorded).
    """
    metrics, config = read_finished_run(run_dir)
    run_dir = Path(run_dir)
    missing = [key for key in ("task", "method", "lam", "seed", "metric", "final") if key not in metrics]
    missing += [key for key in ("model", "batch_size", "epochs", "learning_rate") if key not in config]
    if missing:
        raise ValueError(f"run folder {run_dir} is incomplete: metrics.json / run_config.json lack {', '.join(missing)}")
    parsed = parse_run_dir(run_dir)  # the workflow's layout …/{model}/{task}/{setting}/seed{n}, or another folder
    return {
        "run_dir": str(run_dir), "model": parsed.model if parsed is not None else str(config["model"]),
        # the setting's folder (base, istar_lam-1_zeta0.2, …): the parent of a seed{n} folder
        "task": metrics["task"], "setting": run_dir.parent.name if seed_of(run_dir.name) is not None else run_dir.name,
        "method": metrics["method"], "lam": float(metrics["lam"]),
        "zeta": None if metrics.get("zeta") is None else float(metrics["zeta"]), "layers": metrics.get("layers"),
        # runs written before the token selection was a setting read real tokens
        "tokens": metrics.get("tokens", "real"),
        "batch_size": int(config["batch_size"]), "epochs": int(config["epochs"]),
        "learning_rate": float(config["learning_rate"]), "seed": int(metrics["seed"]), "metric": metrics["metric"],
        "final": dict(metrics["final"]), "standin": bool(metrics.get("standin", False)),
        "history": list(metrics.get("epochs", [])), "sigma_s_isoscore": list(metrics.get("sigma_s_isoscore", [])),
        "heldout": (config.get("data_meta") or {}).get("heldout"),
        "ran": {"precision": (config.get("precision") or {}).get("effective"), "threads": config.get("threads"),
                "code_sha256": (config.get("provenance") or {}).get("code_sha256")},
    }


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _read_search(run_dirs) -> tuple[list[dict], str, str]:
    """The search runs of one model × task, read; with that model and task."""
    runs = [read_run(run_dir) for run_dir in run_dirs]
    pairs = sorted({(run["model"], run["task"]) for run in runs})
    if len(pairs) > 1:
        raise ValueError("the runs mix model × task pairs " + ", ".join(f"{m} × {t}" for m, t in pairs)
                         + ": select one model and task at a time")
    return runs, *pairs[0]


def _candidates(runs: list[dict], metric: str) -> list[dict]:
    """Every setting of the runs with its mean score over seeds, best first (the module docstring's order)."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        if metric not in run["final"]:
            raise ValueError(f"run folder {run['run_dir']} has no final {metric!r} in metrics.json "
                             f"(it has {', '.join(run['final']) or 'none'})")
        key = json.dumps([run[k] for k in SETTING_KEYS])
        for other in groups.get(key, []):
            if other["seed"] == run["seed"]:
                raise ValueError(f"run folders {other['run_dir']} and {run['run_dir']} are the same setting and seed "
                                 f"{run['seed']}: give each run once")
        groups.setdefault(key, []).append(run)
    candidates = []
    for members in groups.values():
        score, score_std = _mean_std([float(run["final"][metric]) for run in members])
        candidates.append({**{k: members[0][k] for k in SETTING_KEYS}, "score": score, "score_std": score_std,
                           "seeds": len(members), "runs": [run["run_dir"] for run in members]})
    # stable sort: settings tied on all three keys keep the order in which they were given
    candidates.sort(key=lambda c: (math.inf if math.isnan(c["score"]) else -c["score"], abs(c["lam"]), c["zeta"] or 0.0))
    return candidates


def _scored_on(runs: list[dict], model: str, task: str) -> dict:
    """The split the search runs were scored on: ``heldout_fraction`` and ``heldout_seed`` (None for the
    validation split)."""
    kinds = {json.dumps(run["heldout"], sort_keys=True) for run in runs}
    if len(kinds) > 1:
        raise ValueError(f"the search runs of {model} × {task} were scored on different splits ({len(kinds)} kinds: "
                         "the validation split and/or held-out splits of the training data): select from runs of one "
                         "protocol only (search.selection_split)")
    heldout = runs[0]["heldout"]
    return {"heldout_fraction": heldout["fraction"] if heldout else None,
            "heldout_seed": heldout["seed"] if heldout else None}


def _best_per_method(candidates: list[dict], besides: str) -> dict:
    """Method → its best candidate (the :data:`SETTING_KEYS`, ``score``, ``seeds``), for every method but ``besides``."""
    baselines = {}
    for candidate in candidates:
        if candidate["method"] != besides:
            baselines.setdefault(candidate["method"], {k: candidate[k] for k in (*SETTING_KEYS, "score", "seeds")})
    return baselines


def _choice(model: str, task: str, metric: str, chosen: dict, standin: bool, protocol: str, scored_on: dict,
            candidates: list[dict], out) -> dict:
    """The ``best.json`` of the module docstring for the ``chosen`` setting (the :data:`SETTING_KEYS`, ``score``,
    ``score_std``, ``seeds``), written to ``out`` (atomically, its content hash included) unless it is None."""
    result = {"model": model, "task": task, "metric": metric,
              **{key: chosen[key] for key in (*SETTING_KEYS, "score", "score_std", "seeds")}, "standin": standin,
              "protocol": protocol, **scored_on, "settings": len(candidates),
              "baselines": _best_per_method(candidates, chosen["method"]), "candidates": candidates}
    return result if out is None else artifacts.write_json(out, result, digest=True)  # what was written, with its hash


def select_best(run_dirs, out=None, metric: str | None = None, lambda_zero: bool = False) -> dict:
    """Pick the best setting of one model × task from its search runs (see the module docstring).

    Parameters
    ----------
    run_dirs : sequence of finished run folders, all of one model and task.
    out : where to write the result as JSON (atomically); None writes nothing.
    metric : the metric to rank by (a key of metrics.json ``final``); None: the task's
        headline metric (metrics.json ``metric``).
    lambda_zero : the λ grid held 0 (``search.lambdas``): Base is one of I-STAR's candidates, so the
        choice may be no regularisation (``method`` ``base``, λ = 0).

    Returns
    -------
    dict in the format of the module docstring.
    """
    run_dirs = list(run_dirs)
    if not run_dirs:
        raise ValueError("no run folders given: select_best needs the finished search runs of one model and task")
    runs, model, task = _read_search(run_dirs)
    metric = metric or runs[0]["metric"]
    candidates = _candidates(runs, metric)
    # I-STAR's choice is the selection (Base among its candidates where λ = 0 was in its grid); baselines
    # searched beside it (search.tune_baselines) each get their own
    searched = [c for c in candidates if c["method"] == SEARCHED_METHOD or (lambda_zero and c["method"] == BASELINE_METHOD)]
    best = (searched or candidates)[0]
    scored_on = _scored_on(runs, model, task)
    protocol = "heldout" if scored_on["heldout_fraction"] is not None else "validation"
    return _choice(model, task, metric, best, any(run["standin"] for run in runs), protocol, scored_on, candidates, out)


def fixed_choice(*, model: str, task: str, lam: float, zeta: float, tokens: str, layers, baseline_runs=(),
                 out=None) -> dict:
    """The ``best.json`` of a model × task whose I-STAR λ and ζ were fixed in advance (no I-STAR search).

    Parameters
    ----------
    model, task : the model's short name and the task key.
    lam, zeta : the fixed λ and ζ (config ``final.istar``).
    tokens, layers : the penalty's token selection and layers (config ``penalty``).
    baseline_runs : finished search runs of the baselines (``search.tune_baselines``: tuned baselines
        against the fixed I-STAR); each baseline method's best setting becomes its ``baselines`` entry.
    out : where to write it (atomically, with its content hash); None writes nothing.

    Returns
    -------
    dict in the format of the module docstring: ``protocol`` ``"fixed"``, ``score`` and ``score_std``
    None, ``seeds`` 0; batch size, epochs and learning rate None (the training section's values, as for
    every run that is not searched over them). Without baseline runs ``settings`` is 0 and there are
    no candidates; with them ``settings``, ``candidates`` and the held-out split are the baselines'.
    """
    from istar.registry.tasks import get_task

    baseline_runs = list(baseline_runs)
    candidates, scored_on = [], {"heldout_fraction": None, "heldout_seed": None}
    if baseline_runs:
        runs, *pair = _read_search(baseline_runs)
        if tuple(pair) != (model, task):
            raise ValueError(f"the baseline runs are of {pair[0]} × {pair[1]}, the fixed choice of {model} × {task}: "
                             "give the search runs of the same model and task")
        if any(run["method"] == SEARCHED_METHOD for run in runs):
            raise ValueError(f"I-STAR run(s) given beside the λ | ζ fixed in advance for {model} × {task}: only the "
                             "baselines are searched there (search.tune_baselines); give only their runs")
        candidates, scored_on = _candidates(runs, get_task(task).metric), _scored_on(runs, model, task)
    fixed = {"method": SEARCHED_METHOD, "lam": float(lam), "zeta": float(zeta), "layers": layers, "tokens": tokens,
             "batch_size": None, "epochs": None, "learning_rate": None, "score": None, "score_std": None, "seeds": 0}
    return _choice(model, task, get_task(task).metric, fixed, False, "fixed", scored_on, candidates, out)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output best.json")
    parser.add_argument("--task-metric", dest="metric", default=None,
                        help="metric to rank settings by (default: the task's headline metric in metrics.json)")
    parser.add_argument("--fixed", default=None, metavar="JSON",
                        help="no I-STAR search: write the choice fixed in advance, given as JSON with model, task, "
                        "lam, zeta, tokens and layers (the workflow's confirmatory protocol, config final.istar); "
                        "run folders given beside it are the tuned baselines' search (search.tune_baselines)")
    parser.add_argument("--lambda-zero", action="store_true",
                        help="the λ grid held 0: the Base runs among the search runs are I-STAR at λ = 0, so the "
                        "search may choose no regularisation")
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="finished search runs of one model and task")


def run_cli(args) -> int:
    if args.fixed is not None:
        result = fixed_choice(**json.loads(args.fixed), baseline_runs=args.run_dirs, out=args.out)
        tuned = "".join(f"; {method} tuned: batch size {choice['batch_size']}, {choice['epochs']} epochs, learning "
                        f"rate {choice['learning_rate']:g}" for method, choice in result["baselines"].items())
        print(f"{result['model']} × {result['task']}: I-STAR λ = {result['lam']:g}, ζ = {result['zeta']:g} fixed in "
              f"advance (no I-STAR search){tuned} -> {args.out}")
        return 0
    if not args.run_dirs:
        raise ValueError("istar select: no search run folders given (or --fixed for a choice fixed in advance)")
    result = select_best(args.run_dirs, out=args.out, metric=args.metric, lambda_zero=args.lambda_zero)
    spread = "" if result["score_std"] is None else f" ± {result['score_std']:.4f}"
    print(f"{result['model']} × {result['task']}: best of {len(result['candidates'])} setting(s) is {result['method']} "
          f"λ = {result['lam']:g}, ζ = {result['zeta']}, batch size {result['batch_size']}, {result['epochs']} epochs, "
          f"learning rate {result['learning_rate']:g}: {result['metric']} = {result['score']:.4f}{spread} over "
          f"{result['seeds']} seed(s), scored on the {result['protocol']} split -> {args.out}")
    return 0
