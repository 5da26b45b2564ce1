rule evaluate:
    input:
        data=data_files,
        model=f"{RUN}/model",
    output:
        f"{RUN}/eval.json",
    log:
        "logs/evaluate/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/evaluate/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
    params:
        spec=evaluate_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "evaluate --spec {params.spec:q} > {log} 2>&1"
