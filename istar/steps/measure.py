"""The measurement step: what the workflow records about fine-tuned models once they are trained.

Before any model is loaded, every run folder is checked (:func:`check_inputs`): a finished run's
outputs, of the task of the data given (``metrics.json``), trained on that very data (the data
fingerprint in ``run_config.json``), fine-tuned from the model the Σ_S file is of, of the Σ_S
file's shape; and the Σ_S file is readable, finite and of the data's task.

For each run folder of a :class:`~istar.config.specs.MeasureSpec` (in the workflow: the runs of one
setting with the seeds the output's path names) the saved model is loaded once and, in this order:

1. evaluated on the split, in the spec's precision (``evaluate``; the workflow always asks), as
   :func:`istar.steps.evaluate.evaluation_report`;
2. run over the split for its activation statistics (:func:`istar.steps.activations.activation_statistics`);
3. analysed (:func:`istar.steps.analyze.analyze_statistics`) against a Σ_S chosen by ``sigma_s_model``
   (``analysis.sigma_s_model``, :mod:`istar.registry.analysis`): the pretrained model's file
   ``sigma_s``, or — ``fine_tuned``, as the authors' analysis — the run's own model's, measured here
   over ``shrinkage_rows`` rows of the training split exactly as ``istar shrinkage`` measures the
   pretrained model's (real tokens, the order of seed 0, the batch size ``batch_size``).

The statistics stay in memory: they hold every [CLS] vector of every layer (for QQP's 40k
validation pairs and BERT-base about 1.6 GB per run), too much to keep a file of per run. By hand,
``istar measure --runs RUN`` measures one run (docs/workflow.md). One job per setting rather than
two or three per run keeps the paper's DAG small (docs/architecture.md). The output, written once at the
end (atomically, with its hash)::

    {"spec": the MeasureSpec as given, "split", "sigma_s": the pretrained Σ_S file or null, "sigma_s_model",
     "zeta", "evaluated": bool,
     "precision": the forward passes' (as they ran),
     "runs": {RUN_FOLDER: {"evaluation": {…} or null, "analysis": {…}, "trained_on": TOKENS}, …},
     "provenance": {"git": {…}, "versions": {…}}}

``provenance`` is the code that measured (:func:`istar.io.provenance.code_provenance`).

``trained_on`` is the run's token selection (``penalty.tokens`` in its run_config.json: which
positions its penalty and Σ_S read); the analysis itself always reads the real tokens of the
split, so runs trained either way are measured on the same rows. ``evaluation`` is in the
format of :func:`istar.steps.evaluate.evaluation_report` and ``analysis`` in that of
:func:`istar.steps.analyze.analyze_statistics`. A job that dies measures its runs again when restarted:
each takes a forward pass or two, not a training run.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from istar.config.specs import MeasureSpec, spec_from_cli
from istar.io import artifacts
from istar.io.provenance import code_provenance

__all__ = ["measure_runs", "check_inputs"]


def measure_runs(spec: MeasureSpec) -> dict:
    """The measurement step: see the module docstring. Returns what was written to ``spec.out``."""
    from tqdm.auto import tqdm

    from istar.registry.analysis import get_sigma_source
    from istar.steps.activations import activation_statistics
    from istar.steps.analyze import ShrinkageReference, analyze_statistics
    from istar.steps.common import open_model_context
    from istar.steps.evaluate import evaluation_report
    from istar.steps.gpu_memory import claim_gpu_share
    from istar.io.results import read_finished_run

    spec.validate()
    missing = [run for run in spec.runs if not (Path(run) / "model").is_dir()]
    if missing:
        raise FileNotFoundError(f"no fine-tuned model/ in {', '.join(missing)}: train these runs first")
    # Before the first model is evaluated, not after: each run is one finished run's outputs,
    # unchanged, with no training state beside them; Σ_S is readable and finite; and each run,
    # the data and Σ_S are of one task and one model (check_inputs).
    finished = {run: read_finished_run(run) for run in spec.runs}
    pretrained = ShrinkageReference.read(spec.sigma_s) if get_sigma_source(spec.sigma_s_model).reads_file else None
    check_inputs(spec, finished, pretrained)
    runs, main_process, precision = {}, True, None
    for run in tqdm(spec.runs, desc="runs measured", unit="run"):
        context = open_model_context(spec.model_data(run))
        claim_gpu_share(context.model, spec.batch_size, spec.max_length, context.precision,
                        context.accelerator.device, trains=False)
        main_process, precision = context.accelerator.is_main_process, context.precision.label
        evaluation = evaluation_report(context, spec.split, spec.batch_size) if spec.evaluate else None
        tensors, metadata = activation_statistics(context, spec.split, spec.batch_size)
        sigma = pretrained or _fine_tuned_sigma(context, spec, run)
        analysis = analyze_statistics(tensors, metadata, sigma, spec.zeta, twonn_discard=spec.twonn_discard,
                                      layers=spec.layers)
        trained_on = finished[run][1].get("tokens", "real")  # runs written before the setting: real tokens
        runs[run] = {"evaluation": evaluation, "analysis": analysis, "trained_on": trained_on}
        print(f"{run}: global IsoScore* (ζ = {spec.zeta}) {analysis['global']['isoscore_star']:.4f}"
              + (f", {evaluation['metric']} {evaluation['metrics'][evaluation['metric']]:.4f}" if evaluation else ""))
        del context, tensors
        gc.collect()  # one model at a time: the next run's is loaded into the memory this one held
    result = {"spec": json.loads(spec.to_json()), "split": spec.split, "sigma_s": spec.sigma_s,
              "sigma_s_model": spec.sigma_s_model, "zeta": spec.zeta, "evaluated": spec.evaluate,
              "precision": precision, "runs": runs, "provenance": code_provenance()}
    if main_process:
        result = artifacts.write_json(spec.out, result, digest=True)
    return result


def _fine_tuned_sigma(context, spec: MeasureSpec, run: str):
    """Σ_S of the run's fine-tuned model: the statistic ``istar shrinkage`` takes of the pretrained one."""
    from istar.steps.analyze import ShrinkageReference
    from istar.steps.shrinkage import training_statistics

    per_layer = training_statistics(context, spec.layers, spec.shrinkage_rows, spec.batch_size, seed=0).per_layer
    return ShrinkageReference(per_layer, {"task": context.task.key, "model": f"{run}/model"},
                              f"the fine-tuned model of {run} ({per_layer[0].count:,} training tokens per layer)")


def check_inputs(spec: MeasureSpec, finished: dict[str, tuple[dict, dict]], pretrained) -> None:
    """Refuse to measure a run on what it was not trained with: the task of its ``metrics.json`` and
    the data fingerprint of its ``run_config.json`` against the prepared folder ``spec.data_dir``,
    and — when the analysis reads the pretrained model's Σ_S file — that file's task, model and
    shape (d, L + 1) against the run's.

    ``finished``: run folder → (metrics, run_config) (:func:`istar.io.results.read_finished_run`);
    ``pretrained``: the Σ_S file as an :class:`istar.steps.analyze.ShrinkageReference`, or None when
    each run's own fine-tuned Σ_S is measured. A ValueError names the run and the fix.
    """
    from istar.config.layout import DEFAULT_TOKENS
    from istar.core.shrinkage import check_sigma_fits, check_sigma_settings
    from istar.data.storage import data_fingerprint, read_meta
    from istar.models.loading import model_shape
    from istar.steps.shrinkage import STALE_SIGMA_FIX

    meta = read_meta(spec.data_dir)
    task, fingerprint = meta["task"], data_fingerprint(meta)
    if pretrained is not None:
        check_sigma_settings(spec.sigma_s, pretrained.provenance, {"rows": spec.shrinkage_rows, "layers": spec.layers,
                                                                   "tokens": DEFAULT_TOKENS}, STALE_SIGMA_FIX)
    for run, (metrics, config) in finished.items():
        if metrics["task"] != task:
            raise ValueError(f"run {run} was trained on {metrics['task']}, but the data {spec.data_dir} is "
                             f"{task}: measure it on the data of {metrics['task']} (its run_config.json names the "
                             f"folder: {config.get('data_dir')}) with the Σ_S of that task")
        trained_on = (config.get("fingerprint_inputs") or {}).get("data")
        if trained_on is not None and trained_on != fingerprint:
            raise ValueError(f"run {run} was trained on other data than {spec.data_dir} holds (the data fingerprint "
                             f"in its run_config.json differs from that of {spec.data_dir}/meta.json: the data was "
                             "prepared again with other settings, or this is another copy); measure it on the data "
                             "it was trained on, or train it again on this data")
        if pretrained is None:
            continue
        provenance = pretrained.provenance
        # the same model if either its source as configured or the folder / hub commit it resolved to agree
        pairs = (("model_source", "model"), ("model_path", "model_path"))
        compared = [(config.get(ours), provenance.get(theirs)) for ours, theirs in pairs
                    if config.get(ours) is not None and provenance.get(theirs) is not None]
        if compared and all(ours != theirs for ours, theirs in compared):
            raise ValueError(f"run {run} was fine-tuned from {config['model_source']}, but {spec.sigma_s} is the "
                             f"Σ_S of {provenance.get('model')}: give the Σ_S of {config['model_source']} on {task}")
        model = Path(run) / "model"
        check_sigma_fits(spec.sigma_s, pretrained.per_layer, provenance, task=task, data=spec.data_dir,
                         shape=model_shape(str(model)), model=model)


def run_cli(args) -> int:
    spec = spec_from_cli(args)
    measure_runs(spec)
    print(f"{len(spec.runs)} run(s) measured -> {spec.out}")
    return 0
