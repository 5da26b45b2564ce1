# Isotropy surveys of pretrained models (config section `survey`): one profile JSON per model ×
# revision, collected into results/aggregate/profiles.csv (and the embedding projections into
# profile_projections.csv), which the profile figures read.
# `snakemake surveys` builds this stage alone; survey.enabled adds it to `all` and the report.


rule survey:
    input:
        text=survey_text_input,
    output:
        PROFILE,
    log:
        "logs/survey/{pmodel}/{revision}.log",
    benchmark:
        "benchmarks/survey/{pmodel}/{revision}.tsv"
    conda:
        GPU_ENV if config["survey"]["gpus"] else CPU_ENV
    threads: THREADS["survey"]
    resources:
        **RESOURCES["survey"],
    params:
        spec=survey_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar survey --spec {params.spec:q} > {log} 2>&1"


rule survey_aggregate:
    input:
        PROFILES,
    output:
        table=PROFILES_TABLE,
        projections=PROJECTIONS_TABLE,
    log:
        "logs/survey_aggregate.log",
    conda:
        CPU_ENV
    shell:
        "python -m istar survey-aggregate {input} --out {output.table} "
        "--projections-out {output.projections} > {log} 2>&1"


rule surveys:
    input:
        PROFILES,
        PROFILES_TABLE,
        PROJECTIONS_TABLE,
        expand(
            "results/figures/{figure}.{ext}",
            figure=PROFILE_FIGURES,
            ext=["png", "pdf"],
        ),
