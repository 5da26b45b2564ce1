"""The report's landing page, written from the study that ran: the verdict first, then what produced it.

``istar summary`` reads the resolved config (``results/config.yaml``, :mod:`istar.pipeline.validate`) and
the aggregate records (``runs.csv``, ``selection.csv``, Fig. 2's simulation when that study ran) and writes
the same text twice: ``results/summary.md`` for a reader without a browser (a terminal, a pull request, a DVC
experiment) and ``results/summary.rst``, the first screen of ``results/report.html``. In this order:

1. the verdict: the claims table (:mod:`istar.report.claims`, built as ``istar table claims`` builds it, the
   declared rule for collapsed runs applied), the forest plot when the figure registry has one the config
   draws, and the collapsed (or excluded) runs per arm (:mod:`istar.report.collapse`);
2. what ran: the protocol that chose I-STAR's λ | ζ (``selection.csv``'s ``protocol``, with the bias it
   implies only where it is true, :data:`istar.report.select.PROTOCOLS`), the models, tasks, arms and seeds
   of the final runs, the training recipe, the declared primary endpoint, the studies beside the final
   comparison, and the scope a verdict holds for.

Every sentence is made from what the records hold: a stage with no runs (a search, CosReg, a figure
study) is not named.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from istar.config.schema import load_yaml
from istar.io import artifacts
from istar.registry.methods import BASELINE_METHOD, METHODS
from istar.registry.tasks import get_task, ordered_tasks
from istar.report.aggregate_csv import as_bool, read_aggregate
from istar.report.claims import NOT_TESTED
from istar.report.tables import listing
from istar.report.figures import FIGURES, STABILITY_CSV, STUDY_FIGURES, switch_enabled
from istar.report.select import selection_note
from istar.report.table_render import Table, render_markdown

__all__ = ["FOREST", "Landing", "landing", "render_summary_markdown", "render_summary_rst", "write_summary"]

FOREST = "forest"
"""The forest plot's name in the figure registry (:data:`istar.report.figures.FIGURES`), shown where the config
draws it."""

FINAL, SEARCH = "final", "search"
"""The studies of runs.csv that are the final comparison and the λ | ζ search (the others are figure studies)."""


class Landing:
    """The landing page as blocks: ``verdict`` (the claims table), ``forest`` (the forest plot's file
    name, or None), ``collapsed`` (one sentence), ``what_ran`` (a list of (label, sentence))."""

    def __init__(self, verdict: Table, forest: str | None, collapsed: str, what_ran: list[tuple[str, str]]):
        self.verdict, self.forest, self.collapsed, self.what_ran = verdict, forest, collapsed, what_ran


def landing(config: dict, runs: pd.DataFrame, selection: pd.DataFrame | None = None,
            stability: pd.DataFrame | None = None) -> Landing:
    """The landing page of a study from its resolved config and aggregate records.

    Parameters
    ----------
    config : dict
        The validated config (every default filled in), e.g. ``results/config.yaml``.
    runs, selection, stability : DataFrame
        ``runs.csv``; ``selection.csv`` (None: no selection recorded); ``fig2_stability.csv`` (None: the
        study did not run).
    """
    from istar.report.table_specs import build

    verdict = _tested(build("claims", runs, selection=selection, stability=stability, config=config))
    # the runs the claims read, under the declared rule: the claims table's last footnote (build appends it), shown
    # once, as its own line
    collapsed = verdict.footnotes.pop()
    return Landing(verdict, f"{FOREST}.png" if switch_enabled(FIGURES[FOREST].switch, config) else None, collapsed,
                   _what_ran(config, runs, selection))


def _tested(table: Table) -> Table:
    """The claims table without its "not tested" rows (they would name arms and stages the study did not
    run), a footnote counting the claims left out."""
    keep = [i for i, row in enumerate(table.cells) if not row[-1].startswith(NOT_TESTED)]
    claims = list(dict.fromkeys(label[0] for label in table.index))
    left = [claim for claim in claims if claim not in {table.index[i][0] for i in keep}]
    table.index, table.cells, table.best = ([part[i] for i in keep] for part in (table.index, table.cells, table.best))
    if left:
        table.footnotes.insert(0, f"Not tested by this study: {len(left)} of the paper's {len(claims)} claims (the "
                                  "claims table under Tables, results/tables/claims.md, lists each with the reason).")
    return table


def _what_ran(config: dict, runs: pd.DataFrame, selection: pd.DataFrame | None) -> list[tuple[str, str]]:
    final = runs[runs["study"] == FINAL]
    tasks = ordered_tasks(final["task"])
    models = list(dict.fromkeys(final["model"]))
    lines = [("Protocol", _protocol(selection, runs)),
             ("Models", "; ".join(f"{model} ({config['models'].get(model, 'not in the config')})" for model in models)),
             ("Tasks and seeds", "; ".join(_seeds(final, task) for task in tasks)),
             ("Arms", _arms(final)),
             ("Training", _recipe(config)),
             ("What ran", _ran(final)),
             ("Primary endpoint", _primary(config))]
    studies = [study for study in dict.fromkeys(runs["study"]) if study not in (FINAL, SEARCH)]
    if studies:
        lines.append(("Studies beside the final comparison", "; ".join(_study(study, runs) for study in studies)))
    if as_bool(runs["standin"]).any():
        lines.append(("Stand-in data", "some results (†) come from stand-in splits of a dev set, not the task's "
                                       "training split: they are not comparable with published numbers"))
    lines.append(("Scope", f"the verdicts hold for {listing(models)} fine-tuned on {_data(config, tasks)} with "
                           "this recipe and these seeds; they say nothing about other models, tasks, data sizes or "
                           "recipes"))
    return lines


def _protocol(selection: pd.DataFrame | None, runs: pd.DataFrame) -> str:
    """How I-STAR's λ | ζ were chosen, per protocol found in selection.csv, with the search's size where one ran."""
    if selection is None or selection.empty:
        return "not recorded (no selection.csv): the tables' footnotes cannot say how λ | ζ were chosen"
    notes = [", ".join(f"{row.model} {get_task(row.task).display}" for row in rows.itertuples()) + ": "
             + selection_note(rows) for _, rows in selection.groupby("protocol", sort=False)]
    searched = runs[runs["study"] == SEARCH]
    if not searched.empty:
        seeds = sorted(searched["seed"].astype(int).unique())
        notes.append(f"The search trained {searched['setting'].nunique()} settings on seed(s) "
                     f"{listing([str(s) for s in seeds])} ({len(searched)} runs).")
    return " ".join(notes)


def _seeds(final: pd.DataFrame, task: str) -> str:
    seeds = sorted(final.loc[final["task"] == task, "seed"].astype(int).unique())
    span = f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2 else \
        ", ".join(map(str, seeds))
    return f"{get_task(task).display} ({get_task(task).metric}), {len(seeds)} seed{'s' * (len(seeds) != 1)} ({span})"


def _arms(final: pd.DataFrame) -> str:
    """The final runs' methods in registry order, each regularised one with its λ (and ζ) per task."""
    arms = []
    for method in (m for m in METHODS if m in set(final["method"])):
        rows = final[final["method"] == method].drop_duplicates(["model", "task", "lam", "zeta", "tokens"])
        label = METHODS[method].label
        if method == BASELINE_METHOD:
            arms.append(label)
            continue
        values = [f"{get_task(row.task).display} λ = {row.lam:g}" + ("" if pd.isna(row.zeta) else f" | ζ = {row.zeta:g}")
                  + ("" if row.tokens == "real" else f", penalty over {row.tokens.replace('_', ' ')}")
                  for row in rows.itertuples()]
        arms.append(f"{label} ({'; '.join(values)})")
    return ", ".join(arms) + f"; each compared with {METHODS[BASELINE_METHOD].label} seed by seed"


def _recipe(config: dict) -> str:
    t = config["training"]
    steps = f"batch {t['batch_size']}" + (f" × {t['gradient_accumulation_steps']} accumulated"
                                           if t["gradient_accumulation_steps"] > 1 else "")
    return (f"{t['epochs']} epoch{'s' * (t['epochs'] != 1)}, {steps}, learning rate {t['learning_rate']:g} "
            f"({t['scheduler']} schedule, warm-up {t['warmup_ratio']:g}), weight decay {t['weight_decay']:g}, "
            f"max length {t['max_length']}, precision {t['mixed_precision']} requested")


def _ran(final: pd.DataFrame) -> str:
    """What the final runs record they ran with (runs.csv): the precision, torch's threads and the package's
    code hash, each value with its number of runs; runs written before these were recorded are counted apart."""
    parts = []
    for column, name in (("precision", "precision"), ("threads", "threads"), ("code_sha256", "code")):
        values = final[column].dropna() if column in final else final["run_dir"].iloc[:0]
        counts = values.astype(str).str.removesuffix(".0").str[:12].value_counts(sort=False)
        missing = len(final) - len(values)
        recorded = ", ".join(f"{value} ({count} runs)" for value, count in counts.items())
        unknown = f"not recorded by {missing} of {len(final)} runs" if missing else ""
        parts.append(f"{name} " + "; ".join(part for part in (recorded, unknown) if part))
    return "; ".join(parts)


def _primary(config: dict) -> str:
    primary = config["inference"]["primary"]
    if primary is None:
        return "none declared: every claim is judged on its pooled estimate"
    contrast = "the λ sweep's trend" if primary["contrast"] == "lambda_sweep" else \
        f"{METHODS[primary['contrast']].label} − {METHODS[BASELINE_METHOD].label}"
    return f"{contrast} on {primary['model']} {get_task(primary['task']).display} (declared in inference.primary)"


def _study(study: str, runs: pd.DataFrame) -> str:
    rows = runs[runs["study"] == study]
    figure = FIGURES.get(STUDY_FIGURES.get(study, ""))
    what = figure.caption.rstrip(".") if figure else study
    return f"{study} ({len(rows)} runs): {what}"


def _data(config: dict, tasks: list[str]) -> str:
    names = listing([get_task(task).display for task in tasks])
    data = config["data"]
    sizes = [f"{data[key]:,} {split} examples" for key, split in (("max_train_samples", "training"),
                                                                   ("max_eval_samples", "evaluation"))
             if data.get(key)]
    return names + (f" (seeded subsamples: at most {' and '.join(sizes)})" if sizes else " (the full splits)")


# ------------------------------------------------------------------------------------- rendering


def render_summary_markdown(page: Landing, title: str) -> str:
    """The landing page as GitHub Markdown (``results/summary.md``)."""
    lines = [f"# {title}", "", "## Verdict", "", render_markdown(page.verdict).strip(), ""]
    if page.forest:
        lines += [f"![Forest plot](figures/{page.forest})", ""]
    lines += [page.collapsed, "", "## What ran", ""]
    lines += [f"- **{label}**: {text}" for label, text in page.what_ran]
    return "\n".join(lines) + "\n"


def render_summary_rst(page: Landing, title: str) -> str:
    """The landing page as reStructuredText (``results/summary.rst``, the report's first screen): the claims
    table as a list-table, the forest plot as a link to the report's entry for its file."""
    lines = [title, "=" * len(title), "", "Verdict", "-------", "", f".. list-table:: {_rst(page.verdict.caption)}",
             "   :header-rows: 1", ""]
    table = page.verdict
    for row in [[*table.index_names, *table.columns], *([*i, *c] for i, c in zip(table.index, table.cells))]:
        lines += [f"   * - {_rst(row[0])}"] + [f"     - {_rst(cell)}" for cell in row[1:]]
    lines.append("")
    lines += [f"{_rst(note)}\n" for note in table.footnotes]
    if page.forest:
        lines += [f"Forest plot: {page.forest}, under Figures.", ""]
    lines += [_rst(page.collapsed), "", "What ran", "--------", ""]
    lines += [f"- **{label}**: {_rst(text)}" for label, text in page.what_ran]
    lines += ["", "The workflow's graph, the tables, figures, configuration and provenance of every result follow "
                  "in this report's sections."]
    return "\n".join(lines) + "\n"


def _rst(text: str) -> str:
    """Markdown emphasis and characters reST reads as markup, as plain text ("–" stays, ``*`` is escaped)."""
    text = str(text).replace("**", "")
    return (text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")
            .replace("_", "\\_")) or "\\ "


def write_summary(config_path, aggregate_dir, out_md, out_rst) -> Landing:
    """``istar summary``: read the resolved config and the aggregate CSVs, write the two files atomically."""
    config = load_yaml(config_path)  # resolved: `istar config --out` filled in every default
    aggregate_dir = Path(aggregate_dir)
    selection_path, stability_path = aggregate_dir / "selection.csv", aggregate_dir / f"{STABILITY_CSV}.csv"
    page = landing(config, read_aggregate(aggregate_dir / "runs.csv"),
                   read_aggregate(selection_path) if selection_path.is_file() else None,
                   read_aggregate(stability_path) if config["studies"]["stability"]["enabled"] else None)
    title = f"I-STAR study: {listing(list(config['models']))} on " \
            f"{listing([get_task(task).display for task in ordered_tasks(config['tasks'])])}"
    artifacts.write_text(out_md, render_summary_markdown(page, title))
    artifacts.write_text(out_rst, render_summary_rst(page, title))
    return page


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("results/config.yaml"),
                        help="the resolved config (`istar config … --out`; default: %(default)s)")
    parser.add_argument("--aggregate-dir", type=Path, default=Path("results/aggregate"),
                        help="folder of runs.csv, selection.csv and fig2_stability.csv (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("results/summary.md"), help="Markdown (default: %(default)s)")
    parser.add_argument("--rst", type=Path, default=Path("results/summary.rst"),
                        help="the same page in reStructuredText, the report's first screen (default: %(default)s)")


def run_cli(args: argparse.Namespace) -> int:
    write_summary(args.config, args.aggregate_dir, args.out, args.rst)
    print(f"{args.out}, {args.rst}")
    return 0

