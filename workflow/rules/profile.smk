# Isotropy profiles of pretrained models (config section `profile`): one JSON per model ×
# revision, collected into results/aggregate/profiles.csv (and the embedding projections into
# profile_projections.csv), which the profile figures read.
# `snakemake profiles` builds this stage alone; profile.enabled adds it to `all` and the report.


rule profile:
    input:
        text=profile_text_input,
    output:
        PROFILE,
    log:
        "logs/profile/{pmodel}/{revision}.log",
    benchmark:
        "benchmarks/profile/{pmodel}/{revision}.tsv"
    conda:
        "../../envs/istar.yaml"
    threads: TRAINING["threads"]
    resources:
        gpu=config["profile"]["gpus"],
        mem_mb=TRAINING["mem_mb"],
        runtime=TRAINING["runtime"],
    params:
        spec=profile_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar profile --spec {params.spec:q} > {log} 2>&1"


rule profile_aggregate:
    input:
        PROFILES,
    output:
        table=PROFILES_TABLE,
        projections=PROJECTIONS_TABLE,
    log:
        "logs/profile_aggregate.log",
    conda:
        "../../envs/report.yaml"
    shell:
        "python -m istar profile-aggregate {input} --out {output.table} "
        "--projections-out {output.projections} > {log} 2>&1"


rule profiles:
    input:
        PROFILES,
        PROFILES_TABLE,
        PROJECTIONS_TABLE,
        expand(
            "results/figures/{figure}.{ext}",
            figure=PROFILE_FIGURES,
            ext=["png", "pdf"],
        ),
