"""The Σ_S step (``istar shrinkage``): the shrinkage covariance of a model on a task's training data, to a file.

Rows are the token vectors of the selected layers at the selected positions (the same
selections as the I-STAR penalty: ``layers``, and ``tokens`` — real tokens, or every position
of the padded batch, :data:`istar.core.tokens.TOKEN_SELECTIONS`), from forward passes without
gradients, until at least ``rows`` rows (250,000 in the paper) have been seen (docs/method.md §3).
The pass is :func:`training_statistics` (shared with the measurement and fine-tuning's per-epoch Σ_S,
around :func:`istar.models.shrinkage.sigma_statistics`), the statistics and their
merges :mod:`istar.core.shrinkage`, the file :mod:`istar.io.sigma_file`; this module only
reads the spec, opens the model and data, and writes the file and its provenance.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from istar.config.specs import ShrinkageSpec
from istar.core.regularizers import LayerSelection
from istar.core.shrinkage import NonFiniteStatistics, save_shrinkage
from istar.data.encoding import EpochShuffleSampler
from istar.io import artifacts
from istar.io.provenance import portable_path
from istar.models.shrinkage import SigmaStatistics, sigma_statistics

if TYPE_CHECKING:
    from istar.data.encoding import Features
    from istar.steps.common import ModelContext

__all__ = ["training_statistics", "compute_shrinkage_file", "STALE_SIGMA_FIX"]

# What a step tells the user when a Σ_S file's settings are not its own (the workflow records each
# job's spec and reruns a Σ_S job whose spec changed, so this finds files made outside it or before).
STALE_SIGMA_FIX = ("compute it again with those settings (`istar shrinkage`; in the workflow, "
                   "`istar adopt-specs` once for a results folder made before jobs recorded their specs)")


def training_statistics(context: ModelContext, layers: LayerSelection, shrinkage_rows: int, batch_size: int, seed: int,
                        tokens: str = "real", *, features: Features | None = None,
                        description: str | None = None) -> SigmaStatistics:
    """The Σ_S pass over a task's training split (:func:`istar.models.shrinkage.sigma_statistics`),
    read in an order fixed by ``seed`` until ``layers`` hold ``shrinkage_rows`` rows: Σ_S of
    ``context``'s model (the pretrained one for ``istar shrinkage``, a fine-tuned one for the
    measurement's ``analysis.sigma_s_model``, the model a run trains after each epoch:
    :mod:`istar.steps.sigma_tracking`, which gives the training ``features`` it already encoded)."""
    from accelerate.data_loader import prepare_data_loader

    accelerator = context.accelerator
    features = context.features("train", with_labels=False) if features is None else features
    loader = context.loader(features, batch_size, sampler=EpochShuffleSampler(len(features), seed))
    # even_batches=False: accelerate would otherwise repeat rows to even out the shards, and Σ_S
    # would count them twice.
    loader = prepare_data_loader(loader, accelerator.device, accelerator.num_processes, accelerator.process_index,
                                 put_on_device=True, even_batches=False)
    return sigma_statistics(context.model.to(accelerator.device), loader, layers, shrinkage_rows, accelerator,
                            description=description or f"Σ_S {context.task.key}", tokens=tokens)


def compute_shrinkage_file(spec: ShrinkageSpec) -> dict:
    """The shrinkage-matrix step: Σ_S of a (pretrained or fine-tuned) model on a task's training data.

    The training split is read in a random order fixed by ``spec.seed``; the result and its
    provenance (model, task, rows, layers, …) are written to ``spec.out``, the provenance also
    to ``spec.out`` with the suffix ``.json``. Returns the provenance.
    """
    from istar.steps.common import open_model_context
    from istar.steps.gpu_memory import claim_gpu_share

    spec.validate()
    context = open_model_context(spec, model_seed=spec.seed)
    claim_gpu_share(context.model, spec.batch_size, spec.max_length, context.precision, context.accelerator.device,
                    trains=False)
    accelerator, task = context.accelerator, context.task
    start = time.perf_counter()
    try:
        statistics = training_statistics(context, spec.layers, spec.rows, spec.batch_size, spec.seed, spec.tokens)
    except NonFiniteStatistics as error:
        raise NonFiniteStatistics(f"Σ_S for {spec.out} is not finite: {error}; nothing was written") from None
    per_layer, indices, rows = statistics.per_layer, statistics.layers, statistics.selection.count
    provenance = {
        # the settings as given, which a reader checks against its own (istar.core.shrinkage.check_sigma_settings)
        "spec": json.loads(spec.to_json()),
        "model": context.model_name, "model_path": portable_path(context.model_path), "task": task.key, "split": "train",
        # a held-out selection split's record (istar.data.holdout): which training rows Σ_S saw
        "data_dir": spec.data_dir, "heldout": context.meta.get("heldout"),
        "standin": context.standin, "layer_spec": spec.layers, "tokens": spec.tokens, "batch_size": spec.batch_size,
        "requested_rows": spec.rows, "max_length": spec.max_length, "seed": spec.seed,
        # the forward passes' precision as it ran (istar.registry.precisions); the sums are float64
        "precision": context.precision.label,
        "num_processes": accelerator.num_processes, "seconds": round(time.perf_counter() - start, 2),
        "num_layers": len(per_layer) - 1,
    }
    if accelerator.is_main_process:
        save_shrinkage(spec.out, per_layer, indices, provenance)
        artifacts.write_json(Path(spec.out).with_suffix(".json"), {**provenance, "layers": indices, "rows": rows})
    accelerator.wait_for_everyone()
    accelerator.print(f"Σ_S of {context.model_name} on {task.display} train: {rows:,} rows ({spec.tokens}) over layers "
                      f"{indices} from {accelerator.num_processes} process(es) -> {spec.out}")
    if rows < spec.rows:
        accelerator.print(f"note: the training data gave only {rows:,} of the {spec.rows:,} requested rows")
    return provenance
