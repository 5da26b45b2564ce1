# inference.collapsed_runs: rerun. Once a cell's final runs exist, the seeds on which any arm
# collapsed get replacements (the next unused seeds); a checkpoint, because the final runs of
# those seeds, and the measurement over all of them, are only known once it has run.


checkpoint collapse_check:
    input:
        lambda wildcards: [
            f"{run}/metrics.json" for run in collapse_check_inputs(wildcards)
        ],
    output:
        COLLAPSE_CHECK,
    log:
        "logs/collapse_check/{model}/{task}.log",
    benchmark:
        "benchmarks/collapse_check/{model}/{task}.tsv"
    conda:
        CPU_ENV
    params:
        runs=collapse_check_inputs,
    shell:
        "python -m istar collapse-check --model {wildcards.model} --task {wildcards.task} --out {output} "
        "{params.runs} > {log} 2>&1"
