rule evaluate:
    input:
        data=data_files,
        model=f"{RUN}/model",
    output:
        f"{RUN}/eval.json",
    params:
        batch_size=TRAINING["eval_batch_size"],
        doc_stride=TRAINING["doc_stride"],
        max_length=max_length,
        data=DATA,
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
    log:
        "logs/evaluate/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/evaluate/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "evaluate --model {input.model} --data {params.data} --out {output} "
        "--batch-size {params.batch_size} --max-length {params.max_length} "
        "--doc-stride {params.doc_stride} > {log} 2>&1"
