"""``istar survey-check``: our I(W) of pythia-70m against the four numbers Machina & Mercer publish.

The NAACL 2024 paper's public code reports, for pythia-70m's final weights, the partition
isotropy I(W) of the input and output embedding matrices, raw and centred (:data:`PUBLISHED`).
This command surveys a model at a revision through :func:`istar.steps.survey.run_survey` (by
default pythia-70m at ``step143000``, its final checkpoint; needs the Hugging Face hub or a
filled cache) and compares the profile's ``partition_isotropy_solver_signs`` values — the
authors' recipe, docs/method.md §8 — with the reference, one line per number with the
difference, pass or fail. Exit status 0 when all pass, 1 otherwise.

Only the static embeddings are compared; the hidden-state pass runs over a few built-in
sentences (:data:`CHECK_TEXT`), which the compared numbers do not depend on.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from istar.config.specs import SurveySpec

__all__ = ["PUBLISHED", "REFERENCE_KEYS", "TOLERANCE", "compare", "run_check"]

PUBLISHED = {"input": 0.95848, "output": 0.08309, "input_centred": 0.99684, "output_centred": 0.97247}
"""pythia-70m's I(W) from the README of the authors' code (src/README.md), rounded to 5 decimals."""

REFERENCE_KEYS = {"input": ("input", "partition_isotropy_solver_signs"),
                  "output": ("output", "partition_isotropy_solver_signs"),
                  "input_centred": ("input", "partition_isotropy_solver_signs_centred"),
                  "output_centred": ("output", "partition_isotropy_solver_signs_centred")}
"""Reference name → (matrix, measure) in the profile's ``static`` section."""

TOLERANCE = 1e-4
"""Largest |ours − reference| that passes: the published numbers carry 5 decimals (±5e-6), and the
authors' float32 exp and float32 centring differ from our float64 log-sum-exp by about 1e-6."""

DEFAULT_MODEL, DEFAULT_REVISION = "EleutherAI/pythia-70m", "step143000"

CHECK_TEXT = ("The cat sat on the mat and looked out of the window.\n"
              "Stock markets fell sharply on Monday after the announcement.\n"
              "Heavy rain is expected across the north of the country tomorrow.\n")


def compare(profile: dict, reference: dict[str, float], tolerance: float = TOLERANCE) -> list[dict]:
    """One dict per reference number: ``name``, ``reference``, ``ours`` (None if the profile lacks
    that matrix, e.g. a tied model has no output one), ``difference`` (ours − reference), ``passed``."""
    rows = []
    for name, expected in reference.items():
        matrix, measure = REFERENCE_KEYS[name]
        ours = profile["static"].get(matrix, {}).get(measure)
        difference = None if ours is None else ours - expected
        rows.append({"name": name, "reference": expected, "ours": ours, "difference": difference,
                     "passed": difference is not None and abs(difference) <= tolerance})
    return rows


def _reference(pairs: list[str] | None) -> dict[str, float]:
    """``NAME=VALUE`` pairs (names of :data:`REFERENCE_KEYS`) → a reference; none: :data:`PUBLISHED`."""
    if not pairs:
        return dict(PUBLISHED)
    reference = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in REFERENCE_KEYS or not value:
            raise ValueError(f"--reference {pair!r}: expected NAME=VALUE with NAME one of {', '.join(REFERENCE_KEYS)}")
        try:
            reference[name] = float(value)
        except ValueError:
            raise ValueError(f"--reference {pair!r}: {value!r} is not a number") from None
    return reference


def run_check(model: str, revision: str | None, reference: dict[str, float], out: Path, device: str = "auto",
              tolerance: float = TOLERANCE) -> list[dict]:
    """Profile ``model`` at ``revision`` into ``out`` and compare it with ``reference``; print and return the rows."""
    from istar.steps.survey import run_survey

    with tempfile.TemporaryDirectory() as folder:
        text = Path(folder) / "check.txt"
        text.write_text(CHECK_TEXT, encoding="utf-8")
        spec = SurveySpec(model=model, text=str(text), out=str(out), revision=revision, tokens=16, sigma_tokens=0,
                           twonn_tokens=0, device=device)
        spec.validate()
        profile = run_survey(spec)
    rows = compare(profile, reference, tolerance)
    print(f"I(W) of {model}" + (f"@{revision}" if revision else "") + f" (one sign per eigenvector, as published) "
          f"against the reference, tolerance {tolerance:g}:")
    for row in rows:
        ours = "missing" if row["ours"] is None else f"{row['ours']:.5f}"
        difference = "" if row["difference"] is None else f"{row['difference']:+.2e}"
        print(f"  {row['name']:<15} reference {row['reference']:.5f}  ours {ours:<8} difference {difference:<10} "
              + ("pass" if row["passed"] else "FAIL"))
    for which, measures in profile["static"].items():
        if measures["solver_signs_fp32_overflow"] or measures["solver_signs_fp32_overflow_centred"]:
            print(f"  note: a plain float32 exp of the {which} matrix overflows (max exponent "
                  f"{measures['solver_signs_max_exponent']:.1f}); ours is computed in log space")
    print("PASS" if all(row["passed"] for row in rows) else "FAIL")
    return rows


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="hub id or local folder (default: %(default)s)")
    parser.add_argument("--revision", default=DEFAULT_REVISION,
                        help="hub revision; '' for the source as it is (default: %(default)s, pythia's final weights)")
    parser.add_argument("--reference", action="append", metavar="NAME=VALUE",
                        help=f"a reference number, NAME one of {', '.join(REFERENCE_KEYS)}; repeat it "
                             "(default: the four published numbers for pythia-70m)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest |difference| that passes "
                                                                            "(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("results/survey-check/profile.json"),
                        help="where the profile JSON goes (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")


def run_cli(args) -> int:
    rows = run_check(args.model, args.revision or None, _reference(args.reference), args.out, args.device,
                     args.tolerance)
    return 0 if all(row["passed"] for row in rows) else 1
