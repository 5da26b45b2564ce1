"""The tables the workflow writes: one registry of what each reads, which switch draws it, and who builds it.

Like :mod:`istar.report.figures`, the workflow imports this module to list its targets, so it imports
neither pandas nor matplotlib: the building function is looked up when a table is built
(``istar table NAME``).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path

from istar.registry import lookup
from istar.report.figures import switch_enabled

__all__ = ["TableEntry", "TABLES", "TABLE_NAMES", "get_table", "enabled_tables", "build"]


@dataclass(frozen=True)
class TableEntry:
    """A table: ``name`` (the stem of its files, ``results/tables/{name}.{csv,md,tex}``), ``switch``
    (the config section whose ``enabled`` key asks for it; None: always), ``data`` (the aggregate
    CSV it reads, ``runs`` or ``selection``), ``builder`` (``module:function`` returning a
    :class:`istar.report.table_render.Table` from that CSV's DataFrame), ``states_protocol``
    (the builder also takes the selection CSV, to state the selection protocol in a footnote),
    ``reads_stability`` (it also takes Fig. 2's simulation, when that study is on) and ``reads_config``
    (it also takes the resolved config, ``results/config.yaml``: what the study declared; every such table
    compares arms paired by seed, so the declared rule for collapsed runs is applied to its runs first,
    :func:`istar.report.collapse.apply_collapse_rule`, and a footnote says what it did)."""

    name: str
    switch: str | None
    data: str
    builder: str
    states_protocol: bool = False
    reads_stability: bool = False
    reads_config: bool = False


TABLES: dict[str, TableEntry] = {
    entry.name: entry
    for entry in (
        TableEntry("table1", None, "runs", "istar.report.tables:table1", states_protocol=True, reads_config=True),
        TableEntry("table2", None, "selection", "istar.report.tables:table2"),
        TableEntry("padding", "studies.padding", "runs", "istar.report.padding_study:padding_table", reads_config=True),
        TableEntry("claims", None, "runs", "istar.report.claims:claims_table", states_protocol=True,
                   reads_stability=True, reads_config=True),
        TableEntry("seeds", None, "runs", "istar.report.tables:seed_table"),
    )
}

TABLE_NAMES: tuple[str, ...] = tuple(TABLES)


def get_table(name: str) -> TableEntry:
    """Look a table up by name, with an error that lists the known tables."""
    return lookup(TABLES, name, "table")


def enabled_tables(config: dict) -> list[str]:
    """Names of the tables a validated config asks for, in registry order."""
    return [entry.name for entry in TABLES.values() if switch_enabled(entry.switch, config)]


def build(name: str, frame, selection=None, stability=None, config=None):
    """Build table ``name`` from the DataFrame of its CSV (and, for a table that states the selection
    protocol, the selection CSV's DataFrame or None; for one that reads Fig. 2's simulation, its
    DataFrame or None; for one that reads the config, the resolved config dict or None). A table that
    reads the config pairs runs: it gets the runs that the config's ``inference.collapsed_runs`` keeps (keep
    without a config), and a footnote naming the rule and its counts per arm."""
    entry = get_table(name)
    module, function = entry.builder.split(":")
    builder = getattr(importlib.import_module(module), function)
    extra = (([selection] if entry.states_protocol else []) + ([stability] if entry.reads_stability else [])
             + ([config] if entry.reads_config else []))
    if not entry.reads_config:
        return builder(frame, *extra)
    from istar.report.collapse import apply_collapse_rule, collapse_footnote

    rule = ((config or {}).get("inference") or {}).get("collapsed_runs", "keep")
    kept, counts = apply_collapse_rule(frame, rule)
    table = builder(kept, *extra)
    table.footnotes.append(collapse_footnote(counts))
    return table


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar table``."""
    parser.add_argument("which", choices=TABLE_NAMES,
                        help="table1: performance; table2: chosen λ | ζ; padding: the padding study; claims: the paper's "
                        "claims and their verdicts; seeds: every final run's score")
    parser.add_argument("--runs", type=Path, default=Path("results/aggregate/runs.csv"),
                        help="runs.csv of `istar aggregate` (table1, padding; default: %(default)s)")
    parser.add_argument("--selection", type=Path, default=Path("results/aggregate/selection.csv"),
                        help="selection.csv of `istar aggregate` (table2; table1: the selection protocol's footnote, "
                        "left out when the file does not exist; default: %(default)s)")
    parser.add_argument("--stability", type=Path, default=None,
                        help="fig2_stability.csv of `istar stability` (claims; left out when not given)")
    parser.add_argument("--config", type=Path, default=None,
                        help="the resolved config (results/config.yaml): the rule for collapsed runs and the "
                             "multiplicity plan of the tables that pair runs (inference); claims: the declared primary endpoint, the "
                             "paper models, the training rows (left out: keep every run, nothing declared)")
    parser.add_argument("--out-prefix", type=Path, default=None,
                        help="output path without suffix; writes .csv, .md and .tex (default: results/tables/WHICH)")


def run_cli(args: argparse.Namespace) -> int:
    """Build the chosen table from its CSV and write it; print the files written."""
    from istar.config.schema import load_yaml
    from istar.report.aggregate_csv import read_aggregate
    from istar.report.table_render import write_table

    entry = get_table(args.which)
    source = {"runs": args.runs, "selection": args.selection}[entry.data]
    # a table that states the selection protocol reads it when the selection exists (it is drawn without it too)
    selection = read_aggregate(args.selection) if entry.states_protocol and args.selection.is_file() else None
    stability = read_aggregate(args.stability) if entry.reads_stability and args.stability else None
    config = load_yaml(args.config) if args.config else None
    table = build(args.which, read_aggregate(source), selection=selection, stability=stability, config=config)
    for path in write_table(table, args.out_prefix or Path("results/tables") / args.which):
        print(path)
    return 0
