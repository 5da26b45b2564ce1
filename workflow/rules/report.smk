# Tables, figures and the HTML report. Every rule here reads only the aggregate CSVs (and the
# Fig. 2 simulation's CSV), so restyling a table or figure never reruns training or the simulation.
# Each job (its command and inputs) is the job table's (istar.pipeline.jobs.report_jobs).

from istar.report.figures import FIGURE_NAMES

# an absolute path: Snakemake reads the report's text relative to the Snakefile otherwise
LANDING_PAGE = (
    str(Path(SUMMARY_RST).resolve())
    if Path(SUMMARY_RST).is_file()
    else "report/workflow.rst"
)


rule table:
    input:
        needs_of(f"{TABLE}.csv"),
    output:
        csv=report(
            f"{TABLE}.csv",
            caption="../report/table.rst",
            category="Tables",
        ),
        md=f"{TABLE}.md",
        tex=f"{TABLE}.tex",
    log:
        TABLE_LOG,
    benchmark:
        benchmark_of(TABLE_LOG)
    wildcard_constraints:
        table="|".join(TABLE_NAMES),
    conda:
        CPU_ENV
    params:
        settings=job_settings(f"{TABLE}.csv"),
        argv=job_argv(f"{TABLE}.csv"),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


rule stability:
    output:
        STABILITY,
    log:
        STABILITY_LOG,
    benchmark:
        benchmark_of(STABILITY_LOG)
    conda:
        CPU_ENV
    params:
        settings=job_settings(STABILITY),
        argv=job_argv(STABILITY),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


rule figure:
    input:
        needs_of(f"{FIGURE}.png"),
    output:
        png=report(
            f"{FIGURE}.png",
            caption="../report/figure.rst",
            category="Figures",
        ),
        pdf=f"{FIGURE}.pdf",
    log:
        FIGURE_LOG,
    benchmark:
        benchmark_of(FIGURE_LOG)
    wildcard_constraints:
        figure="|".join(FIGURE_NAMES),
    conda:
        CPU_ENV
    params:
        settings=job_settings(f"{FIGURE}.png"),
        argv=job_argv(f"{FIGURE}.png"),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


rule run_config:
    input:
        workflow.overwrite_configfiles or ["config/config.yaml"],
    output:
        report(
            RESOLVED_CONFIG,
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
        needs_of(SUMMARY_MD),
    output:
        md=SUMMARY_MD,
        rst=SUMMARY_RST,
    log:
        SUMMARY_LOG,
    conda:
        CPU_ENV
    params:
        settings=job_settings(SUMMARY_MD),
        argv=job_argv(SUMMARY_MD),
    shell:
        "python -m istar {params.argv} > {log} 2>&1"


rule report:
    input:
        TABLES,
        FIGURES,
        RESOLVED_CONFIG,
        PROVENANCE_CSV,
        SUMMARY_MD,
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
