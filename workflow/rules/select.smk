# The search's choice per model × task (or the λ | ζ fixed in advance, final.istar): a
# checkpoint, because the final I-STAR runs (and the ζ-sweep and one-layer studies) are only
# known once it has run.


checkpoint select:
    input:
        select_inputs,
    output:
        SELECTION,
    log:
        "logs/select/{model}/{task}.log",
    benchmark:
        "benchmarks/select/{model}/{task}.tsv"
    conda:
        CPU_ENV
    params:
        args=select_args,
    shell:
        "python -m istar select --out {output} {params.args} > {log} 2>&1"


# The padding study's own tuning (studies.padding lam/zeta: tuned): the best of its grid for
# the token selection that penalty.tokens does not cover, chosen the same way.
checkpoint select_tuned:
    input:
        lambda wildcards: [
            f"{run}/metrics.json"
            for run in tuning_runs(wildcards.model, wildcards.task)
        ],
    output:
        TUNED_SELECTION,
    log:
        "logs/select_tuned/{model}/{task}.log",
    benchmark:
        "benchmarks/select_tuned/{model}/{task}.tsv"
    conda:
        "../../envs/istar.yaml"
    params:
        runs=lambda wildcards: tuning_runs(wildcards.model, wildcards.task),
    shell:
        "python -m istar select --out {output} {params.runs} > {log} 2>&1"
