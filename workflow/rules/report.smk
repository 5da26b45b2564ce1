# Tables, figures and the HTML report. Every rule here reads only the aggregate CSVs (and the
# Fig. 2 simulation's CSV), so restyling a table or figure never reruns training or the simulation.
# Which CSV a figure reads comes from the registry istar.report.figures.

from istar.report.figures import FIGURE_NAMES, STABILITY_CSV, figure_csvs

SUMMARY_RST = "results/summary.rst"
# an absolute path: Snakemake reads the report's text relative to the Snakefile otherwise
LANDING_PAGE = (
    str(Path(SUMMARY_RST).resolve())
    if Path(SUMMARY_RST).is_file()
    else "report/workflow.rst"
)


rule table:
    input:
        runs="results/aggregate/runs.csv",
        selection="results/aggregate/selection.csv",
        stability=table_stability_input,
        config="results/config.yaml",
    output:
        csv=report(
            "results/tables/{table}.csv",
            caption="../report/table.rst",
            category="Tables",
        ),
        md="results/tables/{table}.md",
        tex="results/tables/{table}.tex",
    log:
        "logs/table/{table}.log",
    benchmark:
        "benchmarks/table/{table}.tsv"
    wildcard_constraints:
        table="|".join(TABLE_NAMES),
    conda:
        CPU_ENV
    params:
        stability=lambda wildcards, input: (
            f"--stability {input.stability}" if input.stability else ""
        ),
    shell:
        "python -m istar table {wildcards.table} --runs {input.runs} --selection {input.selection} "
        "{params.stability} --config {input.config} --out-prefix results/tables/{wildcards.table} > {log} 2>&1"


rule stability:
    output:
        f"results/aggregate/{STABILITY_CSV}.csv",
    log:
        "logs/stability.log",
    benchmark:
        "benchmarks/stability.tsv"
    conda:
        CPU_ENV
    params:
        repeats=config["studies"]["stability"]["repeats"],
    shell:
        "python -m istar stability --repeats {params.repeats} --out {output} > {log} 2>&1"


rule figure:
    input:
        lambda wildcards: [str(path) for path in figure_csvs(wildcards.figure)],
    output:
        png=report(
            "results/figures/{figure}.png",
            caption="../report/figure.rst",
            category="Figures",
        ),
        pdf="results/figures/{figure}.pdf",
    log:
        "logs/figure/{figure}.log",
    benchmark:
        "benchmarks/figure/{figure}.tsv"
    wildcard_constraints:
        figure="|".join(FIGURE_NAMES),
    conda:
        CPU_ENV
    shell:
        "python -m istar figure {wildcards.figure} --aggregate-dir results/aggregate --out {output.png} "
        "> {log} 2>&1"


rule run_config:
    input:
        workflow.overwrite_configfiles or ["config/config.yaml"],
    output:
        report(
            "results/config.yaml",
            caption="../report/config.rst",
            category="Configuration",
        ),
    log:
        "logs/run_config.log",
    conda:
        CPU_ENV
    shell:
        "python -m istar config {input} --out {output} > {log} 2>&1"


rule summary:
    input:
        runs="results/aggregate/runs.csv",
        selection="results/aggregate/selection.csv",
        config="results/config.yaml",
        stability=(
            f"results/aggregate/{STABILITY_CSV}.csv"
            if config["studies"]["stability"]["enabled"]
            else []
        ),
    output:
        md="results/summary.md",
        rst=SUMMARY_RST,
    log:
        "logs/summary.log",
    conda:
        CPU_ENV
    shell:
        "python -m istar summary --config {input.config} --aggregate-dir results/aggregate "
        "--out {output.md} --rst {output.rst} > {log} 2>&1"


rule report:
    input:
        TABLES,
        FIGURES,
        "results/config.yaml",
        PROVENANCE_CSV,
        "results/summary.md",
        SUMMARY_RST,
    output:
        "results/report.html",
    log:
        "logs/report.log",
    conda:
        "../../envs/snakemake.yaml"
    params:
        configfiles=" ".join(
            f"--configfile {path}" for path in workflow.overwrite_configfiles
        ),
        snakefile=workflow.main_snakefile,
        # the landing page from its top, at the width of its claims table (Snakemake centres the view)
        stylesheet=Path(workflow.basedir) / "report" / "landing.css",
    shell:
        "snakemake --snakefile {params.snakefile} --directory . {params.configfiles} --nolock "
        "--report {output} --report-stylesheet {params.stylesheet} > {log} 2>&1"
