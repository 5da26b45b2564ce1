"""What Snakemake imports while it builds the DAG: config validation with its pre-flight checks on
disk and hub, and the plan (which runs exist, each step's spec).

May import every layer below it; nothing but :mod:`istar.cli` imports it.
"""
