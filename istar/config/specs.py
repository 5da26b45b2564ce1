"""One specification per step: every setting a step depends on, decided once.

The workflow builds each spec from the validated configuration (:mod:`istar.pipeline.plan`), the rule
passes it to the step as one JSON argument (``istar train --spec '{…}'``), and the step reads
nothing else. For manual use the same dataclass generates the command-line options
(``istar train --model … --data … --method istar --lam -1``), so the two cannot drift.

Defaults have one home: a field that mirrors a workflow config key takes its default and
help text from the schema (:mod:`istar.config.schema`) (``metadata["config"]`` names the key).
The other fields are step-level settings the config does not expose; their defaults live here.

Ranges and allowed values have one home too: ``validate()`` holds every field to its schema node
(a config key's, or for a step-level setting the fragment its :func:`option` declares) through
:func:`istar.config.schema.out_of_range`, so a step refuses exactly what the config refuses; what
is left by hand are the checks between fields (a method's λ, a Σ_S file for ζ > 0).

``validate()`` checks a spec and never changes it; what a value *means* (λ of a method that
was not given one, the QA window length, which precision a job gets) is decided where the
spec is built: :func:`istar.pipeline.plan` for the workflow, :func:`spec_from_cli` for the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from istar.config.schema import declared_reads, default_of, out_of_range, schema_entry
from istar.core.tokens import TOKEN_SELECTION_NAMES
from istar.io import artifacts
from istar.registry import precisions
from istar.registry.analysis import get_sigma_source
from istar.registry.compile_modes import compile_conflict
from istar.registry.methods import METHOD_NAMES, get_method
from istar.registry.tasks import TASKS

__all__ = ["PrepareDataSpec", "HoldoutSpec", "ModelData", "TrainSpec", "ShrinkageSpec",
           "MeasureSpec", "SurveySpec", "add_spec_arguments", "spec_from_cli", "AS_GIVEN"]

PRECISIONS = tuple(precisions.PRECISIONS)
PRECISION_HELP = ("autocast precision: no (fp32), fp16 or bf16; on a CPU fp16 and bf16 run as bf16 where the "
                  "processor has it natively, else fp32")


def config_field(key: str, **metadata):
    """A spec field whose default, help, range and allowed values (the command line's choices) come
    from the workflow schema's ``key`` (a dotted config key or ``$defs.NAME``)."""
    entry = schema_entry(key)
    metadata = {"help": entry.get("description", ""), "config": key, "schema": entry, **metadata}
    if "enum" in entry:
        metadata.setdefault("choices", tuple(entry["enum"]))
    if isinstance(entry["default"], list):  # a fresh list per spec
        return field(default_factory=lambda: list(entry["default"]), metadata=metadata)
    return field(default=entry["default"], metadata=metadata)


def option(default=dataclasses.MISSING, help: str = "", schema: dict | None = None, **metadata):
    """A spec field with its own default (a step-level setting the workflow config does not expose);
    ``schema``: its range as a JSON Schema fragment (``{"type": "integer", "minimum": 1}``), and
    ``choices`` are its allowed values."""
    if schema is None and "choices" in metadata:
        schema = {"enum": list(metadata["choices"])}
    return field(default=default, metadata={"help": help, "schema": schema or {}, **metadata})


_NEUTRAL_KEYS = frozenset(key for key, reads in declared_reads().items() if reads == "neutral")


class SpecError(ValueError):
    """An invalid step setting; the message names the option."""


def _parse_layers(text):
    from istar.core.regularizers import parse_layer_selection

    return parse_layer_selection(text)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """Shared behaviour: JSON round trip and checks common to every step."""

    def to_json(self) -> str:
        # (fields are plain values and lists: no need for dataclasses.asdict's deep copy, which
        # costs the workflow about 0.2 s per 2,000 jobs)
        return json.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, sort_keys=True)

    def recorded_json(self) -> str:
        """The settings Snakemake records for the job (its recorded param): every field but those whose
        config key is declared result-neutral (``x-reads: neutral``, e.g. tracking), so that editing one
        reruns nothing."""
        return json.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                           if f.metadata.get("config") not in _NEUTRAL_KEYS}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        values = json.loads(text)
        if unknown := sorted(set(values) - {f.name for f in dataclasses.fields(cls)}):
            raise SpecError(f"{cls.__name__} has no setting(s) {', '.join(unknown)}")
        return cls(**values)

    def validate(self) -> None:
        """Every field finite and in its schema range (:func:`istar.config.schema.out_of_range`);
        subclasses add the checks between fields."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{f.name} must be a finite number; got {value}")
            problem = out_of_range(value, f.metadata["schema"])
            if problem is not None:
                raise SpecError(f"{f.name} must {problem}; got {value!r}")

    def output_folders(self) -> list[Path]:
        """The folders the step writes into: an ``output="folder"`` field itself, an
        ``output="file"`` field's parent (checked by :func:`istar.io.artifacts.check_writable`)."""
        return [Path(getattr(self, f.name)) if f.metadata["output"] == "folder" else Path(getattr(self, f.name)).parent
                for f in dataclasses.fields(self) if "output" in f.metadata]


@dataclass(frozen=True, kw_only=True)
class PrepareDataSpec(Spec):
    """The data step (:func:`istar.data.prepare_task`): one task's splits, normalised, as parquet."""

    task: str = option(help="task key", flag="--task", choices=tuple(TASKS))
    out: str = option(help="folder for train.parquet, validation.parquet and meta.json", flag="--out", output="folder")
    source: str = config_field("data.source")
    mirror: typing.Optional[str] = config_field("data.mirror")
    revision: typing.Optional[str] = option(None, help="hub dataset revision: a branch, tag or 40-hex commit "
                                                       "(default: main); meta.json records its commit")
    hub_dataset: typing.Optional[str] = option(None, help="which hub dataset the task is read from, where it has "
                                                          "several (sst5: SetFit/sst5 or stanfordnlp/sst; default: "
                                                          "the first; data.hub_datasets)")
    allow_standin: bool = config_field("data.allow_standin")
    standin_fraction: float = config_field("data.standin_fraction")
    subset: bool = config_field("data.subset")
    max_train_samples: typing.Optional[int] = config_field("data.max_train_samples")
    max_eval_samples: typing.Optional[int] = config_field("data.max_eval_samples")
    seed: int = config_field("data.seed")


@dataclass(frozen=True, kw_only=True)
class HoldoutSpec(Spec):
    """The held-out selection split (:func:`istar.data.holdout.holdout_split`): a prepared task's
    training rows cut into the search's training part and the held-out part that scores it."""

    data_dir: str = option(help="prepared task folder whose train.parquet is cut", flag="--data")
    out: str = option(help="folder for the search's train.parquet (the rest), validation.parquet (the held-out "
                           "rows) and meta.json", flag="--out")
    fraction: float = config_field("search.heldout_fraction")
    seed: int = config_field("search.heldout_seed")


@dataclass(frozen=True, kw_only=True)
class ModelData(Spec):
    """The model-and-data part every model step shares (see :func:`istar.steps.common.open_model_context`)."""

    model: str = option(help="HF id (optionally @revision), local folder or package:NAME/SUBFOLDER", flag="--model")
    data_dir: str = option(help="prepared task folder (train/validation parquet + meta.json)", flag="--data")
    max_length: int = config_field("training.max_length")
    doc_stride: int = config_field("training.doc_stride")
    segment_ids: bool = config_field("training.segment_ids")
    # Direct calls run in fp32 unless asked; a request runs as istar.registry.precisions.run_precision decides
    # for the device (on a CPU: bf16 where native, else fp32).
    mixed_precision: str = option("no", help=PRECISION_HELP, choices=PRECISIONS)


@dataclass(frozen=True, kw_only=True)
class TrainSpec(ModelData):
    """Everything a fine-tuning run depends on (:func:`istar.steps.train.train`); saved in ``run_config.json``."""

    output_dir: str = option(help="run folder", flag="--out", output="folder")
    # (no enum: validate asks the method registry itself, so a method added to it is a method here)
    method: str = option("base", help="the fine-tuning method (istar.registry.methods)", choices=METHOD_NAMES,
                         schema={})
    lam: float = option(0.0, help="λ, the penalty weight (istar: required; cosreg: default 1)")
    zeta: float = config_field("$defs.zeta", help="ζ ∈ [0, 1], weight of Σ_S in IsoScore* (istar)")
    layers: typing.Any = config_field("penalty.layers", parse=_parse_layers)
    tokens: str = config_field("penalty.tokens")
    sigma_s: typing.Optional[str] = option(None, help="initial Σ_S file from `istar shrinkage` (istar with ζ > 0), "
                                                      "computed with the same --tokens")
    shrinkage_rows: int = config_field("shrinkage.rows")
    recompute_shrinkage: bool = config_field("shrinkage.recompute_every_epoch")
    global_penalty: bool = config_field("penalty.global_penalty")
    learning_rate: float = config_field("training.learning_rate")
    batch_size: int = config_field("training.batch_size")
    eval_batch_size: int = config_field("training.eval_batch_size")
    epochs: int = config_field("training.epochs")
    gradient_accumulation_steps: int = config_field("training.gradient_accumulation_steps")
    warmup_ratio: float = config_field("training.warmup_ratio")
    scheduler: str = config_field("training.scheduler")
    weight_decay: float = config_field("training.weight_decay")
    adam_epsilon: float = config_field("training.adam_epsilon")
    max_grad_norm: float = config_field("training.max_grad_norm")
    deterministic: bool = config_field("training.deterministic")
    compile: str = config_field("training.compile")
    seed: int = option(0, help="run seed (Python, NumPy, torch, data order)")
    checkpoint_every: int = config_field("training.checkpoint_every")
    log_every: int = option(1, help="write a train_log.csv row every K optimizer steps",
                            schema={"type": "integer", "minimum": 1})
    trackers: list[str] = config_field("tracking.trackers")
    mlflow_tracking_uri: typing.Optional[str] = config_field("tracking.mlflow_tracking_uri")
    tracking_experiment: str = config_field("tracking.experiment")

    def validate(self) -> None:
        super().validate()
        method = get_method(self.method)
        if not method.takes("lam") and self.lam != 0.0:
            raise SpecError(f"method {self.method} takes no λ; got lam = {self.lam}")
        if not method.takes("tokens") and self.tokens != TOKEN_SELECTION_NAMES[0]:
            raise SpecError(f"method {self.method} has no penalty whose rows --tokens could choose; "
                            f"leave it at {TOKEN_SELECTION_NAMES[0]}")
        if method.needs_sigma_s(self.zeta) and not self.sigma_s:
            raise SpecError(f"method {self.method} with zeta > 0 needs --sigma-s, the file written by `istar shrinkage`")
        if problem := compile_conflict(self.compile, self.gradient_accumulation_steps, self.tokens):
            raise SpecError(problem)

    @property
    def penalty_layers(self):
        """The hidden states the penalty reads (and a given Σ_S covers): the configured selection, or the
        method's own (CosReg and the baseline: the last layer). The Σ_S every run measures while it trains
        is over ``layers`` (:mod:`istar.steps.sigma_tracking`)."""
        return get_method(self.method).penalty_layers(self.layers)


@dataclass(frozen=True, kw_only=True)
class ShrinkageSpec(ModelData):
    """The Σ_S step (:func:`istar.steps.shrinkage.compute_shrinkage_file`)."""

    out: str = option(help="output Σ_S file", flag="--out", output="file")
    layers: typing.Any = config_field("penalty.layers", parse=_parse_layers)
    tokens: str = config_field("penalty.tokens")
    rows: int = config_field("shrinkage.rows")
    # all_positions: the workflow passes training.batch_size (istar.pipeline.plan.shrinkage_spec), since the
    # padding a row set holds depends on how many sequences share a batch
    batch_size: int = config_field("training.eval_batch_size")
    seed: int = option(0, help="seed of the order in which the training split is read")


@dataclass(frozen=True, kw_only=True)
class MeasureSpec(Spec):
    """The measurement step (:func:`istar.steps.measure.measure_runs`): evaluation (optional), activations and
    analysis of several fine-tuned runs of one model × task, in one process, with nothing written in between."""

    runs: list[str] = option(help="run folders, each holding the fine-tuned model/", flag="--runs")
    data_dir: str = option(help="prepared task folder (train/validation parquet + meta.json)", flag="--data")
    out: str = option(help="output JSON file", flag="--out", output="file")
    sigma_s_model: str = config_field("analysis.sigma_s_model")
    sigma_s: typing.Optional[str] = option(None, help="the Σ_S file of the pretrained model on the task "
                                                      "(sigma_s_model pretrained)", flag="--sigma-s")
    shrinkage_rows: int = config_field("shrinkage.rows")
    evaluate: bool = option(False, help="also compute each model's metrics on the split")
    split: str = option("validation", help="which prepared split", choices=("train", "validation"))
    max_length: int = config_field("training.max_length")
    doc_stride: int = config_field("training.doc_stride")
    segment_ids: bool = config_field("training.segment_ids")
    batch_size: int = config_field("training.eval_batch_size")
    zeta: float = config_field("analysis.zeta")
    twonn_discard: float = config_field("analysis.twonn_discard")
    layers: typing.Any = config_field("penalty.layers", parse=_parse_layers)
    mixed_precision: str = option("no", help=PRECISION_HELP, choices=PRECISIONS)

    def validate(self) -> None:
        super().validate()
        if not self.runs:
            raise SpecError("runs is empty: give at least one run folder")
        if len(set(self.runs)) != len(self.runs):
            raise SpecError(f"runs lists a folder twice: {self.runs}")
        if (self.sigma_s is not None) != get_sigma_source(self.sigma_s_model).reads_file:
            raise SpecError("--sigma-s (the pretrained model's Σ_S file) goes with --sigma-s-model pretrained, and "
                            f"only with it; got sigma_s_model {self.sigma_s_model} and sigma_s {self.sigma_s!r}")

    def model_data(self, run: str) -> ModelData:
        """The model-and-data spec of one run's fine-tuned model (for :func:`istar.steps.common.open_model_context`)."""
        return ModelData(model=str(Path(run) / "model"), data_dir=self.data_dir, max_length=self.max_length,
                         doc_stride=self.doc_stride, segment_ids=self.segment_ids, mixed_precision=self.mixed_precision)


AS_GIVEN = "as-given"
"""The revision label of a profile of the source as it is (no revision listed: a hub id's main, a folder)."""


@dataclass(frozen=True, kw_only=True)
class SurveySpec(Spec):
    """The survey step (:func:`istar.steps.survey.run_survey`): isotropy of one pretrained model at one revision."""

    model: str = option(help="hub id, local folder, package:NAME/SUBFOLDER, or a .gguf file "
                             "(path or package:NAME/FILE.gguf)", flag="--model")
    text: str = option(help="text sample: a prepared task folder (istar prepare-data) or a UTF-8 text file, "
                            "one document per line", flag="--text")
    out: str = option(help="output JSON file", flag="--out", output="file")
    revision: typing.Optional[str] = option(None, help="hub revision: branch, tag or commit (hub ids only)")
    split: str = config_field("survey.split")
    tokens: int = config_field("survey.tokens")
    sigma_tokens: int = config_field("survey.sigma_tokens")
    zeta: float = config_field("survey.zeta")
    batch_size: int = config_field("survey.batch_size")
    max_length: int = config_field("survey.max_length")
    dtype: str = config_field("survey.dtype")
    twonn_tokens: int = config_field("survey.twonn_tokens")
    twonn_discard: float = config_field("analysis.twonn_discard")
    projection_rows: int = config_field("survey.projection_rows")
    device: str = option("auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    seed: int = option(0, help="seed of the document order")
    trust_remote_code: bool = option(False, help="run the model code its repository ships (needed by models "
                                                 "whose architecture transformers lacks, e.g. CrystalCoder; "
                                                 "survey.models.NAME.trust_remote_code)")


# ------------------------------------------------------------------------------------- CLI


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def add_spec_arguments(parser: argparse.ArgumentParser, spec_class: type) -> None:
    """Options for every field of ``spec_class``, plus ``--spec JSON`` (the workflow's form).

    Fields without a default are required unless ``--spec`` is given. Booleans become
    ``--name`` / ``--no-name`` switches; list fields take one or more values.
    """
    hints = typing.get_type_hints(spec_class)
    parser.set_defaults(spec_class=spec_class)
    parser.add_argument("--spec", help="the whole step specification as JSON (written by the workflow); "
                                       "the other options are then not allowed")
    for f in dataclasses.fields(spec_class):
        hint = hints[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help_text = f.metadata.get("help", "") + (" (required)" if _required(f) else f" (default: {default})")
        if hint is bool:
            kind = {"action": argparse.BooleanOptionalAction}
        elif typing.get_origin(hint) is list:
            kind = {"nargs": "+"}
        else:
            kind = {"choices": f.metadata.get("choices"), "type": f.metadata.get("parse") or next(
                (c for c in (int, float, str) if hint is c or c in typing.get_args(hint)), str)}
        parser.add_argument(_flag(f), dest=f.name, default=None, help=help_text, **kind)


def spec_from_cli(args: argparse.Namespace):
    """Build and validate the spec of a parsed command line (see :func:`add_spec_arguments`).

    Decisions made here and nowhere else for manual use: a run without ``--lam`` gets its
    method's default λ, the schema default of the config key the method registry names
    (:mod:`istar.registry.methods`: CosReg's ``final.cosreg_lambda``, 1); a method without one (I-STAR)
    must be given λ.
    """
    spec_class, fields = args.spec_class, dataclasses.fields(args.spec_class)
    given = {f.name: getattr(args, f.name) for f in fields if getattr(args, f.name) is not None}
    if args.spec is not None:
        if given:
            flags = ", ".join(_flag(f) for f in fields if f.name in given)
            raise SpecError(f"--spec holds the whole specification; do not also give {flags}")
        spec = spec_class.from_json(args.spec)
    else:
        missing = [_flag(f) for f in fields if _required(f) and f.name not in given]
        if missing:
            raise SpecError(f"missing {', '.join(missing)} (or give the whole specification with --spec)")
        if spec_class is TrainSpec and "lam" not in given:
            method = get_method(given.get("method", "base"))
            if method.takes("lam") and method.default_lam_key is None:
                raise SpecError(f"method {method.key} needs --lam (λ), e.g. --lam -1")
            given["lam"] = float(default_of(method.default_lam_key)) if method.takes("lam") else 0.0
        spec = spec_class(**given)
    spec.validate()
    # Before the step loads a model or data: a read-only or unwritable output is named now.
    artifacts.check_writable(*spec.output_folders())
    return spec
