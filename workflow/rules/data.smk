rule prepare_data:
    output:
        train=f"{DATA}/train.parquet",
        validation=f"{DATA}/validation.parquet",
        meta=f"{DATA}/meta.json",
    params:
        out=DATA,
        options=lambda wildcards: " ".join(
            [
                f"--source {config['data']['source']} --mirror {config['data']['mirror']}",
                f"--seed {config['data']['seed']} --standin-fraction {config['data']['standin_fraction']}",
                "--allow-standin" if config["data"]["allow_standin"] else "",
                f"--max-train-samples {config['data']['max_train_samples']}" if config["data"]["max_train_samples"] else "",
                f"--max-eval-samples {config['data']['max_eval_samples']}" if config["data"]["max_eval_samples"] else "",
                f"--revision {config['data']['hub_revisions'][wildcards.task]}"
                if wildcards.task in config["data"]["hub_revisions"]
                else "",
            ]
        ),
    log:
        "logs/prepare_data/{task}.log",
    benchmark:
        "benchmarks/prepare_data/{task}.tsv"
    conda:
        "../../envs/istar.yaml"
    shell:
        "python -m istar prepare-data --task {wildcards.task} --out {params.out} {params.options} > {log} 2>&1"
