#!/usr/bin/env bash
# Run by Snakemake (--sdm conda) once it has created this environment: installs istar itself from
# the workflow's own source, which workflow/Snakefile puts in ISTAR_SOURCE (a checkout, or the git
# repository and revision a Snakemake module was taken from). The dependencies are conda's.
set -euo pipefail
python -m pip install --no-deps --no-build-isolation "${ISTAR_SOURCE:?workflow/Snakefile sets it}"
