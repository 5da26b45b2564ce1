# Every run's metrics and measurements, tagged with the stages and studies that asked for it,
# collected into results/aggregate/*.csv — the only inputs of the tables and figures.


rule aggregate:
    input:
        needs_of(AGGREGATE_RUNS),
    output:
        AGGREGATES,
        provenance=report(
            PROVENANCE_CSV,
            caption="../report/provenance.rst",
            category="Provenance",
        ),
    log:
        AGGREGATE_LOG,
    benchmark:
        benchmark_of(AGGREGATE_LOG)
    conda:
        CPU_ENV
    params:
        settings=job_settings(AGGREGATE_RUNS),
        argv=job_argv(AGGREGATE_RUNS),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


# Table 1's cells, the λ sweep and the Σ_S curves in the form DVC compares across experiments
# (dvc.yaml: metrics and plots; `dvc exp show`, `dvc exp diff`, `dvc plots diff`).
rule experiment:
    input:
        needs_of(EXPERIMENT_METRICS),
    # metrics.json is written last; the curves beside it (lambda_sweep/, sigma_epochs/, declared as
    # DVC plots) are the step's to keep current, as a run's train_log.csv beside its metrics.json.
    output:
        EXPERIMENT_METRICS,
    log:
        EXPERIMENT_LOG,
    conda:
        CPU_ENV
    params:
        settings=job_settings(EXPERIMENT_METRICS),
        argv=job_argv(EXPERIMENT_METRICS),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"
