# Fine-tuning. Its accelerate arguments follow the *granted* GPUs (resources.gpu; in slots of
# 1/K GPU where training.jobs_per_gpu = K shares GPUs, see common.smk):
# ≥ 1 → accelerate with that many processes in training.mixed_precision; 0 → one CPU process.
# A run killed half-way resumes from RUN/resume/ when the job is started again.


rule train:
    input:
        data=DATA_MANIFEST,
        model=MODEL_PIN,
        sigma=needs_of(f"{RUN}/metrics.json"),
    # metrics.json (written last, the run's completion mark) and model/ are what later jobs read;
    # train_log.csv and run_config.json beside them are bound to metrics.json by the step itself
    # (istar.steps.run_folder: cleared before training; istar.io.results: fingerprint and content
    # hash checked when read). Leaving them undeclared saves the paper's DAG 3,800 files to plan
    # (bench/RESULTS.md).
    output:
        metrics=f"{RUN}/metrics.json",
        model=directory(f"{RUN}/model"),
    log:
        TRAIN_LOG,
    benchmark:
        benchmark_of(TRAIN_LOG)
    conda:
        TRAINING_ENV
    threads: THREADS["train"]
    resources:
        **RESOURCES["train"],
    params:
        settings=job_settings(f"{RUN}/metrics.json"),
        argv=job_argv(f"{RUN}/metrics.json"),
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} -- {params.argv} > {log} 2>&1"


# The search stage trains the same way, on SEARCH_DATA (the task's splits, or a held-out split
# of its training rows: search.selection_split); its model folders are deleted once the
# metrics exist unless search.keep_checkpoints is set.
use rule train as train_search with:
    input:
        data=SEARCH_DATA_MANIFEST,
        model=MODEL_PIN,
        sigma=needs_of(f"{SEARCH_RUN}/metrics.json"),
    output:
        metrics=f"{SEARCH_RUN}/metrics.json",
        model=(
            directory(f"{SEARCH_RUN}/model")
            if config["search"]["keep_checkpoints"]
            else temp(directory(f"{SEARCH_RUN}/model"))
        ),
    log:
        search_log(HELDOUT),
    benchmark:
        benchmark_of(search_log(HELDOUT))
    params:
        settings=job_settings(f"{SEARCH_RUN}/metrics.json"),
        argv=job_argv(f"{SEARCH_RUN}/metrics.json"),
