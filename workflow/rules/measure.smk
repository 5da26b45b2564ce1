# Evaluation (final runs), activations and analysis of the fine-tuned models: one job per
# study × setting measures all of that setting's seeds in one process (istar.measure), so the
# paper's DAG holds one job per setting here rather than three per run, and no activations
# file is kept per run. A study's seeds come from the config alone, so these jobs never wait
# for the search's choice unless their setting does.


rule measure:
    input:
        data=data_files,
        models=measured_models,
        sigma=SIGMA,
    output:
        MEASURES,
    log:
        "logs/measure/{study}/{model}/{task}/{setting}.log",
    benchmark:
        "benchmarks/measure/{study}/{model}/{task}/{setting}.tsv"
    conda:
        "../../envs/istar.yaml"
    threads: TRAINING["threads"]
    resources:
        gpu=min(GPUS, 1),
        # every [CLS] vector of every layer is held for TwoNN: about 1.6 GB for QQP with BERT-base
        mem_mb=TRAINING["mem_mb"],
    params:
        spec=measure_spec_json,
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} --mixed-precision no -- "
        "measure --spec {params.spec:q} > {log} 2>&1"
