rule activations:
    input:
        data=data_files,
        model=f"{RUN}/model",
    output:
        f"{RUN}/activations.safetensors",
    params:
        batch_size=TRAINING["eval_batch_size"],
        doc_stride=TRAINING["doc_stride"],
        max_length=max_length,
        data=DATA,
        token_sample=config["analysis"]["token_sample"],
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
    log:
        "logs/activations/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/activations/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "activations --model {input.model} --data {params.data} --out {output} "
        "--batch-size {params.batch_size} --max-length {params.max_length} "
        "--doc-stride {params.doc_stride} --token-sample {params.token_sample} > {log} 2>&1"
