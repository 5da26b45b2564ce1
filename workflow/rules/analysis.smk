rule analyze:
    input:
        activations=f"{RUN}/activations.safetensors",
        sigma=SIGMA,
    output:
        f"{RUN}/analysis.json",
    log:
        "logs/analyze/{model}/{task}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/analyze/{model}/{task}/{setting}/seed{seed}.tsv"
    conda:
        "../../envs/istar.yaml"
    params:
        spec=analyze_spec_json,
    shell:
        "python -m istar analyze --spec {params.spec:q} > {log} 2>&1"
