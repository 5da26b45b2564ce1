# Every run's metrics and measurements, tagged with the stages and studies that asked for it,
# collected into results/aggregate/*.csv — the only inputs of the tables and figures.


rule aggregate:
    input:
        aggregate_inputs,
    output:
        AGGREGATES,
        provenance=report(
            PROVENANCE_CSV,
            caption="../report/provenance.rst",
            category="Provenance",
        ),
    log:
        "logs/aggregate/aggregate.log",
    benchmark:
        "benchmarks/aggregate/aggregate.tsv"
    conda:
        CPU_ENV
    params:
        specs=lambda wildcards: " ".join(
            f"{study}={run}" for plan in final_plans() for study, run in plan.runs
        ),
        selections=" ".join(SELECTIONS),
        measures=lambda wildcards: " ".join(
            sorted({path for plan in final_plans() for path in plan.measures})
        ),
        inference=json.dumps(config["inference"], sort_keys=True),
        analysis=json.dumps(measured_analysis(config), sort_keys=True),
    shell:
        "python -m istar aggregate --out-dir results/aggregate --inference {params.inference:q} "
        "{params.specs} --selection {params.selections} --measures {params.measures} "
        "--analysis {params.analysis:q} > {log} 2>&1"


# Table 1's cells, the λ sweep and the Σ_S curves in the form DVC compares across experiments
# (dvc.yaml: metrics and plots; `dvc exp show`, `dvc exp diff`, `dvc plots diff`).
rule experiment:
    input:
        expand(AGGREGATE, name=["runs", "paired", "epochs"]),
    # metrics.json is written last; the curves beside it (lambda_sweep/, sigma_epochs/, declared as
    # DVC plots) are the step's to keep current, as a run's train_log.csv beside its metrics.json.
    output:
        EXPERIMENT_METRICS,
    log:
        "logs/aggregate/experiment.log",
    conda:
        CPU_ENV
    shell:
        "python -m istar experiment --aggregate-dir results/aggregate --out-dir results/experiment > {log} 2>&1"
