"""Missing outputs are planned again, even where what was built from them exists (the workflow's Snakefile
turns this on).

Snakemake 9 plans a job whose declared outputs are missing only when they are targets or when a job
that needs them is planned. A run interrupted by Ctrl-C (``istar train`` saves a state, then
Snakemake removes the job's outputs) or deleted by hand therefore stays missing once its measurement
and the aggregates exist, and the tables keep reporting it; the same for a Σ_S file, a selection or a
measurement. :func:`plan_missing_outputs` wraps Snakemake's decision of what to run
(``DAG.update_needrun``, in a dry run too): every job it left out whose declared outputs are missing
(temporary ones apart) is given them as its reason and the decision is taken again, which plans that
job and what depends on it; a fine-tuning job then resumes from its saved state where one matches. A
job whose rule may not run here (``--allowed-rules``) stops the workflow before any job, naming its
files (docs/reliability.md).
"""

from __future__ import annotations

import os
import sys

__all__ = ["plan_missing_outputs"]


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
