"""Every use of Snakemake's private side, in one module: what the workflow needs from Snakemake's
internals, for the major version pyproject.toml pins.

``PRIVATE_NAMES`` lists every Snakemake name the workflow and this package use beyond the documented
snakefile API (rules, checkpoints, ``workflow.basedir``, ``workflow.current_basedir``,
``snakemake.utils``): those this module calls, and those the Snakefile and the rule files read where
no public name says the same (where the workflow comes from, ``snakemake.sourcecache``, before istar
can be imported; the ``--resources`` budget, ``workflow.global_resources``, which the GPU slots
rewrite; whether this is the main process, ``workflow.is_main_process`` and ``workflow.local_exec``;
the ``--configfile`` list; the deployment method). Fast tests check that each still exists, so an
upgrade that renames one fails there, not in a user's run, and that no other Snakemake internal is
used in workflow/ or istar/.

Missing outputs are planned again, even where what was built from them exists. Snakemake 9 plans a
job whose declared outputs are missing only when they are targets or when a job that needs them is
planned. A run interrupted by Ctrl-C (``istar train`` saves a state, then Snakemake removes the job's
outputs) or deleted by hand therefore stays missing once its measurement and the aggregates exist,
and the tables keep reporting it; the same for a Σ_S file, a selection or a measurement.
:func:`plan_missing_outputs` wraps Snakemake's decision of what to run (``DAG.update_needrun``, in a
dry run too): every job it left out whose declared outputs are missing (temporary ones apart) is
given them as its reason and the decision is taken again, which plans that job and what depends on
it; a fine-tuning job then resumes from its saved state where one matches. A job whose rule may not
run here (``--allowed-rules``) stops the workflow before any job, naming its files
(docs/reliability.md).

Interrupted jobs are checked again on the whole DAG (:func:`replan_interrupted`): Snakemake 9 checks
its incomplete marks once, before the jobs that depend on a checkpoint's output are added.
"""

from __future__ import annotations

import os
import sys

__all__ = ["PRIVATE_NAMES", "plan_missing_outputs", "replan_interrupted", "planned_jobs", "unless_pending"]

PRIVATE_NAMES = (
    # module, then attribute path: the private names the workflow uses
    ("snakemake.workflow", "Workflow.global_resources"), ("snakemake.workflow", "Workflow.is_main_process"),
    ("snakemake.workflow", "Workflow.local_exec"), ("snakemake.workflow", "Workflow.overwrite_configfiles"),
    ("snakemake.workflow", "Workflow.main_snakefile"), ("snakemake.workflow", "Workflow.deployment_settings"),
    ("snakemake.settings.types", "DeploymentSettings.deployment_method"),
    ("snakemake.settings.types", "DeploymentMethod.CONDA"), ("snakemake.settings.types", "DAGSettings.force_incomplete"),
    ("snakemake.exceptions", "WorkflowError"), ("snakemake.dag", "DAG.rules_allowed_for_needrun"),
    ("snakemake.sourcecache", "LocalSourceFile"), ("snakemake.sourcecache", "LocalGitFile"),
    ("snakemake.sourcecache", "HostingProviderFile"), ("snakemake.sourcecache", "LocalSourceFile.get_path_or_uri"),
    ("snakemake.dag", "DAG.update_needrun"), ("snakemake.dag", "DAG.needrun"), ("snakemake.dag", "DAG.finished"),
    ("snakemake.dag", "DAG.reason"), ("snakemake.dag", "DAG.jobs"), ("snakemake.dag", "DAG.incomplete_files"),
    ("snakemake.dag", "DAG.check_incomplete"), ("snakemake.dag", "DAG.postprocess_after_update"),
    ("snakemake.dag", "DAG.needrun_jobs"),
    ("snakemake.io", "is_flagged"), ("snakemake.exceptions", "IncompleteCheckpointException"),
    ("snakemake.workflow", "Workflow.dag"), ("snakemake.workflow", "Workflow.async_run"),
    ("snakemake.workflow", "Workflow.dag_settings"),
)


def plan_missing_outputs() -> None:
    """Wrap ``snakemake.dag.DAG.update_needrun`` for this process (call it where the whole DAG is planned)."""
    from snakemake.dag import DAG

    decide = DAG.update_needrun
    if getattr(decide, "plans_missing_outputs", False):
        return
    named: set[str] = set()

    async def update_needrun(dag, create_inventory=False):
        await decide(dag, create_inventory)
        lost = _lost_outputs(dag)
        if lost:
            _refuse_what_cannot_run(dag, lost)
            for job, files in lost.items():
                dag.reason(job).missing_output.update(files)
            new = sorted({str(f) for files in lost.values() for f in files} - named)
            named.update(new)
            if new:
                print(f"istar: planned again, with what was built from them, because they are missing (interrupted "
                      f"or deleted): {_listed(new)}; a fine-tuning job resumes from its saved state where one matches",
                      file=sys.stderr)
            await decide(dag, create_inventory=False)

    update_needrun.plans_missing_outputs = True
    DAG.update_needrun = update_needrun


def _lost_outputs(dag) -> dict:
    """Job → its missing declared outputs (temporary ones apart), of the jobs Snakemake left out."""
    from snakemake.io import is_flagged

    lost = {}
    for job in dag.jobs:
        if not (dag.needrun(job) or dag.finished(job)):
            files = [f for f in job.output if not is_flagged(f, "temp") and not os.path.exists(f)]
            if files:
                lost[job] = files
    return lost


def _refuse_what_cannot_run(dag, lost: dict) -> None:
    from snakemake.exceptions import WorkflowError

    allowed = dag.rules_allowed_for_needrun
    stuck = {job: files for job, files in lost.items() if allowed and job.rule.name not in allowed}
    if stuck:
        rules = ", ".join(sorted({job.rule.name for job in stuck}))
        raise WorkflowError(f"{_listed(sorted(str(f) for files in stuck.values() for f in files))}: missing (interrupted "
                            "or deleted) although later results were built from them, and their rule "
                            f"({rules}) is not among --allowed-rules, so the tables would report results that no "
                            f"longer exist: run without --allowed-rules, or allow {rules}; no job was started")


def _listed(paths: list[str], shown: int = 5) -> str:
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def replan_interrupted(workflow) -> list:
    """Run Snakemake's check of incomplete outputs again on the whole DAG (call it in ``onstart``).

    It raises Snakemake's own "incomplete" error, or, under ``--rerun-incomplete`` (set in
    workflow/profiles/default), plans those jobs again. Returns the interrupted files planned again.
    """
    interrupted = workflow.async_run(workflow.dag.incomplete_files())
    workflow.async_run(workflow.dag.check_incomplete())
    if interrupted and workflow.dag_settings.force_incomplete:
        workflow.async_run(workflow.dag.update_needrun())
        workflow.async_run(workflow.dag.postprocess_after_update())
        return list(interrupted)
    return []


def planned_jobs(workflow) -> list:
    """The jobs Snakemake will run."""
    return list(workflow.dag.needrun_jobs())


def unless_pending(read, wait: bool):
    """``read()``, or None while a checkpoint it reads has not run. With ``wait`` Snakemake's own
    exception goes on instead, so that the input function calling this waits for the checkpoint."""
    from snakemake.exceptions import IncompleteCheckpointException

    try:
        return read()
    except IncompleteCheckpointException:
        if wait:
            raise
        return None
