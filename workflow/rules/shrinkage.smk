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
        spec=shrinkage_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "shrinkage --spec {params.spec:q} > {log} 2>&1"
