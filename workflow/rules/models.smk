# Pin each configured model once: a hub revision (ID@REVISION, default main) is resolved to its
# commit and written to resources/models/{model}.json, which the model's steps take as their
# model source (istar.models.loading reads a pin file like any source). The source string is a param,
# so changing the revision in the config reruns this job and, through its output, exactly the
# jobs of that model.


rule pin_model:
    output:
        MODEL_PIN,
    log:
        "logs/pin_model/{model}.log",
    conda:
        CPU_ENV
    params:
        source=lambda wildcards: config["models"][wildcards.model],
    shell:
        "python -m istar pin-model --source '{params.source}' --out {output} > {log} 2>&1"
