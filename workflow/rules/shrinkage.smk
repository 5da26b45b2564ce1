rule shrinkage:
    input:
        data=DATA_MANIFEST,
        model=MODEL_PIN,
    output:
        sigma=SIGMA,
        provenance=SIGMA.replace(".pt", ".json"),
    log:
        shrinkage_log("real"),
    benchmark:
        benchmark_of(shrinkage_log("real"))
    conda:
        TRAINING_ENV
    threads: THREADS["shrinkage"]
    resources:
        **RESOURCES["shrinkage"],
    params:
        settings=job_settings(SIGMA),
        argv=job_argv(SIGMA),
    shell:
        "OMP_NUM_THREADS={threads} python -m istar launch --gpus {resources.gpu} -- {params.argv} > {log} 2>&1"


# Σ_S over every position of padded batches, for the runs whose penalty reads them
# (penalty.tokens: all_positions, or the padding study).
use rule shrinkage as shrinkage_all_positions with:
    output:
        sigma=SIGMA_ALL_POSITIONS,
        provenance=SIGMA_ALL_POSITIONS.replace(".pt", ".json"),
    log:
        shrinkage_log("all_positions"),
    benchmark:
        benchmark_of(shrinkage_log("all_positions"))
    params:
        settings=job_settings(SIGMA_ALL_POSITIONS),
        argv=job_argv(SIGMA_ALL_POSITIONS),


# Under search.selection_split: heldout the search's Σ_S comes from its own training part, so
# no statistic of the held-out rows reaches the runs they score.
if HELDOUT:

    use rule shrinkage as shrinkage_search with:
        input:
            data=SEARCH_DATA_MANIFEST,
            model=MODEL_PIN,
        output:
            sigma=SEARCH_SIGMA,
            provenance=SEARCH_SIGMA.replace(".pt", ".json"),
        log:
            shrinkage_log("real", HELDOUT),
        benchmark:
            benchmark_of(shrinkage_log("real", HELDOUT))
        params:
            settings=job_settings(SEARCH_SIGMA),
            argv=job_argv(SEARCH_SIGMA),

    use rule shrinkage as shrinkage_search_all_positions with:
        input:
            data=SEARCH_DATA_MANIFEST,
            model=MODEL_PIN,
        output:
            sigma=sigma_template("all_positions", HELDOUT),
            provenance=sigma_template("all_positions", HELDOUT).replace(".pt", ".json"),
        log:
            shrinkage_log("all_positions", HELDOUT),
        benchmark:
            benchmark_of(shrinkage_log("all_positions", HELDOUT))
        params:
            settings=job_settings(sigma_template("all_positions", HELDOUT)),
            argv=job_argv(sigma_template("all_positions", HELDOUT)),
