"""Benchmarks and measurements (``python -m bench.NAME``); their results are in bench/RESULTS.md."""

import os
from pathlib import Path

FULL_MIRROR_ENV = "ISTAR_FULL_MIRROR"


def full_mirror() -> Path:
    """The folder of the full GLUE-layout data release (``glue/SST-2/train.tsv``, …) that the
    benchmarks on real data read: ``$ISTAR_FULL_MIRROR``, else ``glue-mirror`` in the working
    directory (the name the CPU study's config uses). A clear error where neither exists."""
    mirror = Path(os.environ.get(FULL_MIRROR_ENV, "glue-mirror"))
    if not (mirror / "glue").is_dir():
        raise SystemExit(f"no GLUE-layout data release at {mirror} (expected {mirror}/glue/SST-2/train.tsv, …): "
                         f"set {FULL_MIRROR_ENV} to the folder that holds glue/, or link it as ./glue-mirror")
    return mirror
