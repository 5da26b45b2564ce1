# The search's choice per model × task (or the λ | ζ fixed in advance, final.istar): a
# checkpoint, because the final I-STAR runs (and the ζ-sweep and one-layer studies) are only
# known once it has run.


checkpoint select:
    input:
        needs_of(SELECTION),
    output:
        SELECTION,
    log:
        SELECT_LOG,
    benchmark:
        benchmark_of(SELECT_LOG)
    conda:
        CPU_ENV
    params:
        settings=job_settings(SELECTION),
        argv=job_argv(SELECTION),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


# The padding study's own tuning (studies.padding lam/zeta: tuned): the best of its grid for
# the token selection that penalty.tokens does not cover, chosen the same way.
checkpoint select_tuned:
    input:
        needs_of(TUNED_SELECTION),
    output:
        TUNED_SELECTION,
    log:
        SELECT_TUNED_LOG,
    benchmark:
        benchmark_of(SELECT_TUNED_LOG)
    conda:
        "../../envs/istar.yaml"
    params:
        settings=job_settings(TUNED_SELECTION),
        argv=job_argv(TUNED_SELECTION),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"
