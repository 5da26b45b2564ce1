rule activations:
    input:
        data=data_files,
        model=f"{RUN}/model",
    output:
        f"{RUN}/activations.safetensors",
    log:
        "logs/activations/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/activations/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
    params:
        spec=activations_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "activations --spec {params.spec:q} > {log} 2>&1"
