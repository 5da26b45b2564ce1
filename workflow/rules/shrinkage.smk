rule shrinkage:
    input:
        data=data_files,
        model=model_source,
    output:
        sigma=SIGMA,
        provenance=SIGMA.replace(".pt", ".json"),
    log:
        "logs/shrinkage/{model}/{task}.log",
    benchmark:
        "benchmarks/shrinkage/{model}/{task}.tsv"
    conda:
        "../../envs/istar.yaml"
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
        mem_mb=TRAINING["mem_mb"],
        runtime=60,
    params:
        spec=shrinkage_spec_json_of(DATA),
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "shrinkage --spec {params.spec:q} > {log} 2>&1"


# Under search.selection_split: heldout the search's Σ_S comes from its own training part, so
# no statistic of the held-out rows reaches the runs they score.
if HELDOUT:

    use rule shrinkage as shrinkage_search with:
        input:
            data=search_data_files,
            model=model_source,
        output:
            sigma=SEARCH_SIGMA,
            provenance=SEARCH_SIGMA.replace(".pt", ".json"),
        log:
            f"logs/shrinkage/{SEARCH_TAG}{{model}}/{{task}}.log",
        benchmark:
            f"benchmarks/shrinkage/{SEARCH_TAG}{{model}}/{{task}}.tsv"
        params:
            spec=shrinkage_spec_json_of(SEARCH_DATA),
