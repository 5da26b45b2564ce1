# The search's choice per model × task: a checkpoint, because the final I-STAR runs (and the
# ζ-sweep and one-layer studies) are only known once it has run.


checkpoint select:
    input:
        lambda wildcards: [
            f"{run}/metrics.json"
            for run in search_runs(wildcards.model, wildcards.task)
        ],
    output:
        SELECTION,
    log:
        "logs/select/{model}/{task}.log",
    benchmark:
        "benchmarks/select/{model}/{task}.tsv"
    conda:
        CPU_ENV
    params:
        runs=lambda wildcards: search_runs(wildcards.model, wildcards.task),
    shell:
        "python -m istar select --out {output} {params.runs} > {log} 2>&1"
