# Evaluation, activations and analysis of the fine-tuned models: one job per setting and set
# of seeds (named in the path) measures those runs in one process (istar.steps.measure), so the
# paper's DAG holds about one job per setting here rather than two or three per run, and no
# activations file is kept per run. A study's seeds come from the config alone, so these jobs
# never wait for the search's choice unless their setting does.


rule measure:
    input:
        data=DATA_MANIFEST,
        needs=needs_of(MEASURES),
    output:
        MEASURES,
    log:
        MEASURE_LOG,
    benchmark:
        benchmark_of(MEASURE_LOG)
    conda:
        TRAINING_ENV
    threads: THREADS["measure"]
    resources:
        **RESOURCES["measure"],
    params:
        settings=job_settings(MEASURES),
        argv=job_argv(MEASURES),
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} -- {params.argv} > {log} 2>&1"
