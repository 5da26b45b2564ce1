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
            f"{study}={run}" for study, run in all_run_specs()
        ),
        selections=" ".join(SELECTIONS),
        measures=lambda wildcards: " ".join(all_measures()),
    shell:
        "python -m istar aggregate --out-dir results/aggregate {params.specs} --selection {params.selections} "
        "--measures {params.measures} > {log} 2>&1"
