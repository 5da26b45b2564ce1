"""What Snakemake imports while it builds the DAG: config validation with its pre-flight checks on
disk and hub, the plan (which runs exist, each step's spec), and rebuild (missing outputs planned
again although what was built from them exists).

May import every layer below it; nothing but :mod:`istar.cli` imports it.
"""
