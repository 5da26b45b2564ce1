"""The ``istar`` command: one subcommand per workflow step, files in, files out.

    istar config         validate a workflow config (defaults filled in)
    istar prepare-data   normalise a task's splits to parquet (+ meta.json)
    istar holdout-data   cut a prepared training split into the search's part and the held-out part that scores it
    istar shrinkage      Σ_S of a model on a task's training data
    istar train          fine-tune with base / cosreg / istar (run under `accelerate launch` for several processes)
    istar launch         run a step on N GPUs (accelerate) or on the CPU: istar launch --gpus N -- train …
    istar measure        evaluation, IsoScore*, IsoScore, TwoNN and cosine similarity per layer of one run or several
    istar aggregate      collect runs into the aggregate CSVs; istar select: best search setting
    istar collapse-check which final seeds collapsed and the seeds that replace them (collapsed_runs: rerun)
    istar experiment     Table 1's cells, the λ sweep and Σ_S curves as DVC metrics and plots
    istar table          Table 1 / Table 2 as CSV, Markdown and LaTeX
    istar stability      Fig. 2's simulation (IsoScore* of mini-batches vs batch size) as CSV
    istar figure         one of the paper's figures (PNG and PDF)
    istar summary        the report's landing page: the verdict and what ran (results/summary.md, .rst)
    istar survey        isotropy of a pretrained model: static embeddings and every layer, one revision
    istar survey-aggregate   the profiles as CSVs (results/aggregate/profiles.csv, profile_projections.csv)
    istar survey-check  pythia-70m's I(W) against the four numbers Machina & Mercer publish (needs the hub)
    istar bundle        a confirmatory study as a folder for a GPU machine without network or Snakemake
    istar run-bundle    run a bundle's jobs there and pack their results (python -m istar run-bundle …)
    istar import-bundle unpack those results here, then aggregate, tables and figures
    istar cost          a config's GPU-hours and wall time on N GPUs of a named kind, one and K jobs per GPU

Run ``istar SUBCOMMAND --help`` for the options. Multi-process:
``accelerate launch --multi_gpu --num_processes 2 -m istar train …``.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from dataclasses import dataclass

from istar.io.revisions import RevisionUnavailableError
from istar.steps.tracking import TrackerUnavailableError

@dataclass(frozen=True)
class Subcommand:
    """One ``istar`` subcommand.

    module : where its code lives (imported only when the subcommand is the one run).
    summary : one line for ``istar --help``.
    spec : for a step whose options are exactly its spec's fields, that spec class's name in
        :mod:`istar.config.specs`; the options are generated from it (:func:`istar.config.specs.add_spec_arguments`).
        Without it the module defines ``add_cli_arguments(parser)``.
    step : the module's function the built spec is handed to; without it the module's
        ``run_cli(args) -> exit status`` runs (a step that prints what it did, or has an exit status of its own).
    """

    module: str
    summary: str
    spec: str | None = None
    step: str | None = None


SUBCOMMANDS = {
    "config": Subcommand("istar.pipeline.validate", "validate a workflow config and print it with every default filled in"),
    "prepare-data": Subcommand("istar.data.prepare", "normalise a task's splits to parquet (+ meta.json)", "PrepareDataSpec"),
    "holdout-data": Subcommand("istar.data.holdout", "cut a prepared training split into a search part and a held-out part",
                               "HoldoutSpec"),
    "pin-model": Subcommand("istar.models.loading", "resolve a model source's hub revision to its commit, once (a pin file)"),
    "shrinkage": Subcommand("istar.steps.shrinkage", "Σ_S of a model on a task's training data",
                            "ShrinkageSpec", "compute_shrinkage_file"),
    "train": Subcommand("istar.steps.train", "fine-tune with base / cosreg / istar"),
    "launch": Subcommand("istar.steps.launch", "run a step with the processes and precision its granted GPUs allow"),
    "measure": Subcommand("istar.steps.measure", "evaluation, activations and analysis of several fine-tuned runs in one process",
                          "MeasureSpec"),
    "aggregate": Subcommand("istar.report.aggregate", "collect runs into the aggregate CSVs"),
    "experiment": Subcommand("istar.report.experiment", "Table 1's cells, the λ sweep and Σ_S curves as DVC metrics and plots"),
    "select": Subcommand("istar.report.select", "pick the best search setting of a model and task"),
    "collapse-check": Subcommand("istar.report.collapse", "which final seeds collapsed and the seeds that replace them (rerun)"),
    "table": Subcommand("istar.report.table_specs", "render Table 1 / Table 2 from the aggregate CSVs"),
    "stability": Subcommand("istar.steps.stability", "simulate Fig. 2's data: IsoScore* of mini-batches vs batch size"),
    "figure": Subcommand("istar.report.figures", "draw one of the paper's figures from the aggregate CSVs"),
    "summary": Subcommand("istar.report.summary", "the report's landing page: the verdict and what ran, as Markdown and reST"),
    "survey": Subcommand("istar.steps.survey", "isotropy of a pretrained model's static embeddings and every layer (one revision)",
                         "SurveySpec", "run_survey"),
    "survey-aggregate": Subcommand("istar.report.survey_aggregate", "collect isotropy profiles into CSVs"),
    "survey-check": Subcommand("istar.steps.survey_check", "compare a model's I(W) with published numbers (default: pythia-70m)"),
    "bundle": Subcommand("istar.pipeline.bundle", "a confirmatory study as a folder for a GPU machine without network or Snakemake"),
    "run-bundle": Subcommand("istar.pipeline.bundle_run", "run a bundle's jobs on this machine and pack their results"),
    "import-bundle": Subcommand("istar.pipeline.bundle_import", "unpack a bundle's results, then aggregate, tables and figures"),
    "adopt-specs": Subcommand("istar.pipeline.adopt", "record the specs of a results folder made before jobs recorded "
                              "them, naming the files that differ"),
    "cost": Subcommand("istar.pipeline.cost", "a config's GPU-hours and wall time on N GPUs of a kind, alone and packed"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the module of ``command`` is imported (so ``istar --help`` is instant)."""
    from istar import __version__

    parser = argparse.ArgumentParser(prog="istar", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"istar {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, entry in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=entry.summary, description=entry.summary)
        sub.set_defaults(subcommand=entry)
        if name == command:
            if entry.spec is not None:
                from istar.config import specs

                specs.add_spec_arguments(sub, getattr(specs, entry.spec))
            else:
                importlib.import_module(entry.module).add_cli_arguments(sub)
    return parser


class Terminated(BaseException):
    """SIGTERM outside a step's own handling (a BaseException, like KeyboardInterrupt for SIGINT)."""


def _terminate(signum, frame):
    raise Terminated


def main(argv=None) -> int:
    """Run one subcommand: hand a step its spec built from the command line, else call the module's
    ``run_cli``. Errors a user can fix print one line ``istar CMD: error: …`` (exit 2;
    a refused write or a busy run folder exit 1); SIGTERM and SIGINT exit 128 + signal with one
    line (``istar train`` saves a state first: :class:`istar.steps.resume.StopRequest`)."""
    from istar.io.artifacts import StorageError
    from istar.io.runlock import FolderLockedError
    from istar.steps.resume import Interrupted

    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command if command in SUBCOMMANDS else None).parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        entry = args.subcommand
        module = importlib.import_module(entry.module)
        if entry.step is None:
            return module.run_cli(args)
        from istar.config.specs import spec_from_cli

        getattr(module, entry.step)(spec_from_cli(args))
        return 0
    except (ValueError, FileNotFoundError, RevisionUnavailableError, TrackerUnavailableError, StorageError,
            FolderLockedError) as error:
        print(f"istar {args.command}: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, (StorageError, FolderLockedError)) else 2
    except Interrupted as stop:  # train, after saving its state
        print(f"\nistar {args.command}: {stop}", file=sys.stderr)
        return 128 + stop.signum
    except (KeyboardInterrupt, Terminated) as stop:
        signum = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        print(f"\nistar {args.command}: stopped by {signum.name}: every output is written whole or not at all, and a "
              "training run's last saved state (OUT/resume/) is kept; run the same command again to resume or redo "
              "the step", file=sys.stderr)
        return 128 + signum
    finally:
        end_process_group()


def end_process_group() -> None:
    """Tear a multi-process run's process group down while every rank is still here.

    Left to interpreter shutdown, the process group's backend threads are destroyed in no
    particular order and a rank can abort ("terminate called without an active exception")
    after its work is done. All ranks meet first, so none leaves while another still talks.
    """
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()
        distributed.destroy_process_group()

