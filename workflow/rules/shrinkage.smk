rule shrinkage:
    input:
        data_files,
    output:
        sigma=SIGMA,
        provenance=SIGMA.replace(".pt", ".json"),
    params:
        batch_size=TRAINING["eval_batch_size"],
        doc_stride=TRAINING["doc_stride"],
        max_length=max_length,
        model=model_source,
        data=DATA,
        layers=layer_spec(config["shrinkage"]["layers"]),
        rows=config["shrinkage"]["rows"],
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
        mem_mb=TRAINING["mem_mb"],
        runtime=60,
    log:
        "logs/shrinkage/{model}/{task}.log",
    benchmark:
        "benchmarks/shrinkage/{model}/{task}.tsv"
    conda:
        "../../envs/istar.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "shrinkage --model {params.model} --data {params.data} --out {output.sigma} --layers {params.layers} "
        "--rows {params.rows} --batch-size {params.batch_size} --max-length {params.max_length} "
        "--doc-stride {params.doc_stride} > {log} 2>&1"
