"""What Snakemake imports while it builds the DAG: config validation with its pre-flight checks on
disk and hub, the plan (which runs exist, each step's spec), and rebuild (missing outputs planned
again although what was built from them exists).

May import: io, core, registry, config, data, models, steps and report (the layer contract:
:mod:`istar.layers`). In the package nothing but :mod:`istar.cli` imports it; the workflow's rule
files import it and, for names only, io, config and report (``WORKFLOW_IMPORTS`` in
:mod:`istar.layers`).
"""
