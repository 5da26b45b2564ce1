rule analyze:
    input:
        activations=f"{RUN}/activations.safetensors",
        sigma=SIGMA,
    output:
        f"{RUN}/analysis.json",
    params:
        zeta=config["analysis"]["zeta"],
        discard=config["analysis"]["twonn_discard"],
        layers=layer_spec(config["shrinkage"]["layers"]),
    log:
        "logs/analyze/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/analyze/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    shell:
        "python -m istar analyze --activations {input.activations} --sigma-s {input.sigma} --zeta {params.zeta} "
        "--twonn-discard {params.discard} --layers {params.layers} --out {output} > {log} 2>&1"
