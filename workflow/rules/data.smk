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
        CPU_ENV
    params:
        spec=prepare_data_spec_json,
    shell:
        "python -m istar prepare-data --spec {params.spec:q} > {log} 2>&1"


# search.selection_split: heldout - the search trains on part of the training split and is
# scored on the rest (istar.data.holdout); the final runs keep the whole training split.
if HELDOUT:

    # bookkeeping, like prepare_data: it stays on the submitting host under a cluster profile
    localrules:
        holdout_data,

    rule holdout_data:
        input:
            DATA_MANIFEST,
        output:
            train=f"{SEARCH_DATA}/train.parquet",
            validation=f"{SEARCH_DATA}/validation.parquet",
            meta=f"{SEARCH_DATA}/meta.json",
        log:
            f"logs/holdout_data/{{task}}/{HELDOUT}.log",
        benchmark:
            f"benchmarks/holdout_data/{{task}}/{HELDOUT}.tsv"
        conda:
            CPU_ENV
        params:
            spec=holdout_spec_json,
        shell:
            "python -m istar holdout-data --spec {params.spec:q} > {log} 2>&1"
