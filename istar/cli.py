"""The ``istar`` command: one subcommand per workflow step, files in, files out.

    istar prepare-data   normalise a task's splits to parquet (+ meta.json)
    istar shrinkage      Σ_S of a model on a task's training data
    istar train          fine-tune with base / cosreg / istar (run under `accelerate launch` for several processes)
    istar evaluate       metrics of a saved model on a prepared split
    istar activations    [CLS] and token vectors of every layer on the evaluation split

Run ``istar SUBCOMMAND --help`` for the options. Multi-process:
``accelerate launch --multi_gpu --num_processes 2 -m istar train …``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "prepare-data": ("istar.data", "normalise a task's splits to parquet (+ meta.json)"),
    "shrinkage": ("istar.shrinkage", "Σ_S of a model on a task's training data"),
    "train": ("istar.train", "fine-tune with base / cosreg / istar"),
    "evaluate": ("istar.evaluate", "metrics of a saved model on a prepared split"),
    "activations": ("istar.activations", "[CLS] and token vectors of every layer on the evaluation split"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="istar", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, (module, summary) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        sub.set_defaults(module=module)
        importlib.import_module(module).add_cli_arguments(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return importlib.import_module(args.module).run_cli(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"istar {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
