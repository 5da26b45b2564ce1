# The mirror files are the inputs: a changed source file reruns the job (the hub: none).
rule prepare_data:
    input:
        prepare_data_sources,
    output:
        train=f"{DATA}/train.parquet",
        validation=f"{DATA}/validation.parquet",
        meta=f"{DATA}/meta.json",
    log:
        "logs/prepare_data/{task}.log",
    benchmark:
        "benchmarks/prepare_data/{task}.tsv"
    conda:
        "../../envs/istar.yaml"
    params:
        spec=prepare_data_spec_json,
    shell:
        "python -m istar prepare-data --spec {params.spec:q} > {log} 2>&1"
