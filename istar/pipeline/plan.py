"""Which runs a configuration asks for, and each step's spec.

Settings and the paths they are spelled in are :mod:`istar.config.layout`'s. Each step's spec (:mod:`istar.config.specs`) is built here from the validated config: every default,
the QA window length and what λ means per method are decided in these functions and nowhere
else. The Snakemake rules only call them, with the paths of their inputs and outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import operator
from pathlib import Path

from istar.config.gpu_slots import micro_batches_per_step
from istar.config.layout import DEFAULT_TOKENS, Setting, heldout_folder
from istar.config.specs import AS_GIVEN, HoldoutSpec, MeasureSpec, PrepareDataSpec, ShrinkageSpec, SurveySpec, TrainSpec
from istar.core.tokens import TOKEN_SELECTION_NAMES, get_token_selection
from istar.registry.analysis import get_sigma_source
from istar.registry.collapse_rules import get_collapse_rule
from istar.registry.methods import BASELINE_METHOD, SEARCHED_METHOD, get_method
from istar.registry.tasks import SPLITS, TASKS

__all__ = ["replaces_collapsed", "search_settings", "istar_or_base", "selected_setting", "fixed_setting", "fixed_choice_args", "final_settings", "baseline_choices",
           "tuned_tokens", "tuning_settings", "tuned_setting", "study_runs",
           "in_study", "study_seeds", "needs_sigma", "task_max_length", "prepare_data_spec", "prepare_data_inputs",
           "train_spec", "heldout_name", "holdout_spec",
           "shrinkage_spec", "measure_spec", "aggregate_options", "AS_GIVEN", "survey_targets", "survey_text_task", "survey_spec"]


def _training_grid(search: dict) -> list[tuple]:
    grids = (search["batch_sizes"], search["epochs"], search["learning_rates"])
    if not any(grids):
        return [(None, None, None)]
    if not all(grids):
        raise ValueError("search.batch_sizes, search.epochs and search.learning_rates must be given together")
    return list(itertools.product(*grids))


def search_settings(config: dict, model: str, task: str) -> list[Setting]:
    """Stage 1 of ``model`` × ``task``: I-STAR over λ × ζ (× batch size × epochs × learning rate when
    searched); λ = 0 in the grid is Base (one run per training value, whatever ζ), so the search can
    choose no regularisation; none where λ | ζ is fixed in advance (``final.istar``). With
    ``search.tune_baselines``, also the final stage's other methods over the training grid: beside a
    fixed I-STAR these are the whole search (tuned baselines against a fixed I-STAR)."""
    search, tokens = config["search"], config["penalty"]["tokens"]
    grid = _training_grid(search)
    settings = [] if fixed_setting(config, model, task) is not None else [
        istar_or_base(float(lam), float(zeta), tokens).with_training(
            Setting("base", batch_size=bs, epochs=ep, learning_rate=lr))
        for lam, zeta, (bs, ep, lr) in itertools.product(search["lambdas"], search["zetas"], grid)]
    if search["tune_baselines"]:
        settings += [baseline.with_training(Setting("base", batch_size=bs, epochs=ep, learning_rate=lr))
                     for baseline in _baselines(config) for bs, ep, lr in grid]
    return list(dict.fromkeys(settings))


def _baselines(config: dict) -> list[Setting]:
    """The final stage's methods other than the searched one, each penalty at its configured λ (``final.methods``,
    the key its registry entry names: ``default_lam_key``)."""
    penalised = [get_method(key) for key in config["final"]["methods"] if key not in (BASELINE_METHOD, SEARCHED_METHOD)]
    return [Setting(BASELINE_METHOD)] + [
        Setting(method.key, lam=float(_config_value(config, method.default_lam_key)),
                tokens=config["penalty"]["tokens"])
        for method in penalised]


def _config_value(config: dict, key: str):
    """The value of a dotted config key (``final.cosreg_lambda``) in a validated config."""
    return functools.reduce(operator.getitem, key.split("."), config)


def selected_setting(selection: dict, config: dict) -> Setting:
    """The I-STAR setting a ``best.json`` (``istar select``) names — Base where the search chose λ = 0;
    training values only if searched."""
    training = Setting("base")
    if trains_training_grid(config):
        training = Setting("base", batch_size=int(selection["batch_size"]), epochs=int(selection["epochs"]),
                           learning_rate=float(selection["learning_rate"]))
    if selection["method"] == BASELINE_METHOD:
        return training
    return Setting("istar", lam=float(selection["lam"]), zeta=float(selection["zeta"]),
                   tokens=config["penalty"]["tokens"]).with_training(training)


def tuned_setting(selection: dict) -> Setting:
    """The padding study's tuned I-STAR variant a tuning ``padding.json`` (``istar select``) names: its λ, ζ
    and token selection, trained with the ``training`` section's values like the grid it won."""
    return Setting("istar", lam=float(selection["lam"]), zeta=float(selection["zeta"]), tokens=selection["tokens"])


def fixed_setting(config: dict, model: str, task: str) -> Setting | None:
    """The I-STAR setting fixed in advance for ``model`` × ``task`` (``final.istar``, the confirmatory
    protocol), or None when that pair is searched. It trains with the ``training`` section's values."""
    fixed = config["final"]["istar"].get(model, {}).get(task)
    if fixed is None:
        return None
    return Setting("istar", lam=float(fixed["lam"]), zeta=float(fixed["zeta"]), tokens=config["penalty"]["tokens"])


def fixed_choice_args(config: dict, model: str, task: str) -> dict:
    """The arguments of :func:`istar.report.select.fixed_choice` (``istar select --fixed``) for a fixed pair."""
    setting = fixed_setting(config, model, task)
    return {"model": model, "task": task, "lam": setting.lam, "zeta": setting.zeta, "tokens": setting.tokens,
            "layers": config["penalty"]["layers"]}


def trains_training_grid(config: dict) -> bool:
    return _training_grid(config["search"]) != [(None, None, None)]


def final_settings(config: dict, selection: Setting | None, baselines: dict[str, Setting] | None = None) -> list[Setting]:
    """Stage 2: base, CosReg (λ = final.cosreg_lambda; if in ``final.methods``) and the chosen I-STAR setting.

    ``selection`` None gives the runs that do not depend on the search (base and CosReg when
    the training hyperparameters are not searched); with a selection all of them. The baselines
    train with I-STAR's training values, or, under ``search.tune_baselines``, with their own
    (``baselines``: method → its best setting, :func:`baseline_choices`; None while the search that
    chooses them has not run: the baselines are then left out, {}: I-STAR's training values).
    """
    others = _baselines(config)
    if selection is None:
        return [] if trains_training_grid(config) else others
    if baselines is None and config["search"]["tune_baselines"]:
        return [selection]
    chosen = baselines or {}
    # a search that chose λ = 0 chose Base: its I-STAR arm is the Base run, planned once
    return list(dict.fromkeys([chosen.get(setting.method) or setting.with_training(selection) for setting in others]
                              + [selection]))


def baseline_choices(selection: dict) -> dict[str, Setting]:
    """Method → the baseline setting a ``best.json`` chose for it (``baselines``, written when
    ``search.tune_baselines`` searched the baselines too); {} otherwise."""
    return {method: Setting(method, lam=float(choice["lam"]), tokens=choice["tokens"],
                            batch_size=int(choice["batch_size"]), epochs=int(choice["epochs"]),
                            learning_rate=float(choice["learning_rate"]))
            for method, choice in (selection.get("baselines") or {}).items()}


def tuned_tokens(config: dict) -> list[str]:
    """The token selections of the padding study's tuned variants: those other than ``penalty.tokens``
    (``studies.padding`` with ``lam: tuned``; empty otherwise)."""
    if config["studies"]["padding"]["lam"] != "tuned":
        return []
    return [key for key in TOKEN_SELECTION_NAMES if key != config["penalty"]["tokens"]]


def tuning_settings(config: dict) -> list[Setting]:
    """The padding study's tuning grid (``studies.padding.tuning``): I-STAR over λ × ζ with each tuned token selection."""
    grid = config["studies"]["padding"]["tuning"]
    return [Setting("istar", lam=float(lam), zeta=float(zeta), tokens=tokens)
            for tokens in tuned_tokens(config) for lam in grid["lambdas"] for zeta in grid["zetas"]]


def istar_or_base(lam: float, zeta: float, tokens: str) -> Setting:
    """The setting of I-STAR at ``lam`` | ``zeta``; at λ = 0 the penalty is off, so the baseline's."""
    return Setting("base") if lam == 0 else Setting("istar", lam=lam, zeta=zeta, tokens=tokens)


def study_seeds(config: dict, study: str, task: str) -> list[int]:
    """The seeds of the final runs (``study == "final"``) or of a figure study on ``task``: the
    study's own seeds, else the final stage's for that task (``final.seeds_by_task``, else ``final.seeds``)."""
    final = config["final"]
    final_seeds = list(final["seeds_by_task"].get(task) or final["seeds"])
    return final_seeds if study == "final" else list(config["studies"][study]["seeds"] or final_seeds)


def replaces_collapsed(config: dict) -> bool:
    """Whether the final stage trains replacement seeds for collapsed runs (``inference.collapsed_runs``: rerun,
    :mod:`istar.registry.collapse_rules`): they are known only after a checkpoint on the final runs."""
    return get_collapse_rule(config["inference"]["collapsed_runs"]).replaces


def in_study(config: dict, study: str, model: str, task: str) -> bool:
    """Whether ``study`` is on and covers ``model`` × ``task`` (its empty ``models`` | ``tasks`` lists mean all)."""
    spec = config["studies"][study]
    return spec["enabled"] and model in (spec["models"] or config["models"]) and task in (spec["tasks"] or config["tasks"])


def study_settings(config: dict, study: str, selection: Setting | None, num_layers: int | None = None,
                   tuned: Setting | None = None) -> list[Setting] | None:
    """The settings of a figure study for one model × task.

    Returns None when the study needs the search's choice (``lam`` or ``zeta``: selected) and
    ``selection`` is None, or the padding study's own tuning (``lam: tuned``) and ``tuned`` (its
    choice) is None; ``num_layers`` (L) is needed for ``single_layer`` with ``layers: all``.
    """
    spec, tokens = config["studies"][study], config["penalty"]["tokens"]
    if "selected" in (spec.get("lam"), spec.get("zeta")) and selection is None:
        return None

    def chosen(key: str) -> float:
        """The study's λ or ζ: the search's choice where it says selected, else its number."""
        return getattr(selection, key) if spec[key] == "selected" else float(spec[key])

    if study in ("lambda_sweep", "twonn", "layerwise"):
        # λ = 0 is the baseline: it trains as Base (one run, no Σ_S pass), not as I-STAR with a zero weight
        settings = [istar_or_base(float(lam), float(spec["zeta"]), tokens) for lam in spec["lambdas"]]
        if study != "lambda_sweep" and Setting("base") not in settings:
            settings.append(Setting("base"))
        return settings
    if study == "cosreg_means":
        return [Setting("cosreg", lam=float(lam), tokens=tokens) for lam in spec["lambdas"]] + [Setting("base")]
    if study == "zeta_sweep":
        return [Setting("istar", lam=chosen("lam"), zeta=float(zeta), tokens=tokens) for zeta in spec["zetas"]]
    if study == "padding":
        if spec["lam"] == "tuned":  # (with zeta: tuned, as validated)
            return None if selection is None or tuned is None else [Setting("base"), selection, tuned]
        return [Setting("base")] + [Setting("istar", lam=chosen("lam"), zeta=chosen("zeta"), tokens=key)
                                    for key in TOKEN_SELECTION_NAMES]
    if study == "single_layer":
        if spec["layers"] == "all" and num_layers is None:
            return None
        layers = list(range(1, num_layers + 1)) if spec["layers"] == "all" else list(spec["layers"])
        lam, zeta = chosen("lam"), chosen("zeta")
        return [Setting("istar", lam=lam, zeta=zeta, layer=k, tokens=tokens) for k in layers] + [
            Setting("istar", lam=lam, zeta=zeta, tokens=tokens)]
    raise ValueError(f"unknown study {study!r}")


def study_runs(config: dict, study: str, model: str, task: str, selection: Setting | None,
               num_layers: int | None = None, tuned: Setting | None = None) -> list[tuple[Setting, int]] | None:
    """(setting, seed) pairs of a study for one model × task (None: needs the search's or the tuning's choice)."""
    if not in_study(config, study, model, task):
        return []
    settings = study_settings(config, study, selection, num_layers, tuned)
    if settings is None:
        return None
    return [(setting, seed) for setting in settings for seed in study_seeds(config, study, task)]


# ------------------------------------------------------------------------------------- specs


def needs_sigma(setting: Setting) -> bool:
    """Whether a run reads the pretrained Σ_S (a method that shrinks towards it, with ζ > 0)."""
    return get_method(setting.method).needs_sigma_s(setting.zeta)



def task_max_length(config: dict, task: str) -> int:
    """Tokens per example: SQuAD's windows are longer (question + a slice of the context)."""
    training = config["training"]
    return training["qa_max_length"] if task == "squad" else training["max_length"]


def prepare_data_spec(config: dict, *, task: str, out: str) -> PrepareDataSpec:
    """One task's data as the ``data`` section asks (a hub revision only where one is pinned)."""
    data = config["data"]
    return _spec(PrepareDataSpec, config, task=task, out=out, revision=data["hub_revisions"].get(task),
                 hub_dataset=data["hub_datasets"].get(task))


def prepare_data_inputs(config: dict, task: str) -> list[str]:
    """The mirror files ``prepare_data`` reads for ``task``: its rule's inputs, so that a changed
    file reruns it. Empty when the data come from the hub (source ``hub``, or ``auto`` without
    the mirror folder); a file the mirror lacks is left out (a stand-in, or the job's own error)."""
    from istar.data.mirror import mirror_file  # (pandas: only once a prepare job is planned)

    data = config["data"]
    root = Path(data["mirror"]) if data["mirror"] is not None else None
    if data["source"] == "hub" or root is None or not root.is_dir():
        return []
    files = (root / mirror_file(task, split) for split in SPLITS)
    return [str(path) for path in files if path.is_file()]


def heldout_name(config: dict) -> str | None:
    """The held-out selection split's folder name (``heldout0.2_seed0``), or None when the search is
    scored on the validation split (``search.selection_split``, the paper's protocol).

    The workflow puts this name into the paths of the held-out data, the search's Σ_S and the
    search runs, so a changed fraction or seed is a new path. Which protocol a selection used is
    recorded by the data itself (:mod:`istar.data.holdout`), not by this name.
    """
    search = config["search"]
    if search["selection_split"] == "validation":
        return None
    return heldout_folder(search["heldout_fraction"], search["heldout_seed"])


def holdout_spec(config: dict, *, data_dir: str, out: str) -> HoldoutSpec:
    """The cut of ``data_dir``'s training split into the search's part and the held-out part."""
    return _spec(HoldoutSpec, config, data_dir=data_dir, out=out)


def _spec(spec_class, config: dict, **given):
    """A ``spec_class`` of the ``given`` values, its other fields that claim a config key (``config_field``)
    at that key's value in ``config``: what a field claims is what it is built from, so the two cannot
    drift. Every other field keeps its own default."""
    claimed = {f.name: _config_value(config, f.metadata["config"]) for f in dataclasses.fields(spec_class)
               if f.name not in given and f.metadata.get("config", "$").split(".")[0] in config}
    return spec_class(**claimed, **given)


# the settings only a method that shrinks towards Σ_S (takes ζ) reads
_ISTAR_OPTIONS = ("recompute_shrinkage", "global_penalty")


def train_spec(config: dict, *, model: str, task: str, setting: Setting, seed: int, data_dir: str, output_dir: str,
               sigma_s: str | None) -> TrainSpec:
    """The fine-tuning spec of one run: its setting, the rest from ``training`` and ``shrinkage``.

    A setting's batch size, epochs and learning rate override the training defaults when
    the search covers them; λ is the setting's (0 for the baseline, which has none); the
    I-STAR options are set for I-STAR runs only; ``sigma_s`` is read when ζ > 0. Every run
    measures Σ_S after each epoch (istar.steps.sigma_tracking), over ``layers`` and the ``shrinkage``
    section's rows.
    """
    training = config["training"]
    given = {"model": model, "data_dir": data_dir, "output_dir": output_dir, "method": setting.method,
             "lam": float(setting.lam), "seed": int(seed), "tokens": setting.tokens,
             "max_length": task_max_length(config, task), "mixed_precision": training["mixed_precision"],
             "gradient_accumulation_steps": micro_batches_per_step(training),
             "learning_rate": setting.learning_rate or training["learning_rate"],
             "batch_size": setting.batch_size or training["batch_size"], "epochs": setting.epochs or training["epochs"]}
    if setting.layer is not None:
        given["layers"] = setting.layer
    if get_method(setting.method).takes("zeta"):
        given |= {"zeta": setting.zeta, "sigma_s": sigma_s if needs_sigma(setting) else None}
    else:  # the I-STAR options stay at their defaults, so that editing them reruns no other method's runs
        given |= {name: TrainSpec.__dataclass_fields__[name].default for name in _ISTAR_OPTIONS}
    return _spec(TrainSpec, config, **given)


def shrinkage_spec(config: dict, *, model: str, task: str, data_dir: str, out: str,
                   tokens: str = DEFAULT_TOKENS) -> ShrinkageSpec:
    """Σ_S of the pretrained model on the task's training data, over the rows ``tokens`` selects
    (batches of the evaluation batch size, or of the training batch size where padding counts).

    Its forward passes run in the fine-tuning precision, as the per-epoch Σ_S inside the runs
    does, so the initial and the recomputed Σ_S come from the same arithmetic; the covariance
    is accumulated in float64 either way."""
    training = config["training"]
    uses_training = get_token_selection(tokens).sigma_uses_training_batches
    return _spec(ShrinkageSpec, config, model=model, data_dir=data_dir, out=out, tokens=tokens,
                 max_length=task_max_length(config, task), mixed_precision=training["mixed_precision"],
                 batch_size=training["batch_size"] if uses_training else training["eval_batch_size"])


def measure_spec(config: dict, *, runs: list[str], task: str, data_dir: str, sigma_s: str, out: str) -> MeasureSpec:
    """Evaluation, activations and analysis of a setting's runs, in the fine-tuning precision (the
    score a run reports is then the one its training evaluated; statistics stay float32/float64).
    Every run is evaluated: the forward pass costs little beside the activations'. ``sigma_s`` (the
    pretrained Σ_S file) is passed where ``analysis.sigma_s_model`` reads it."""
    reads_file = get_sigma_source(config["analysis"]["sigma_s_model"]).reads_file
    return _spec(MeasureSpec, config, runs=list(runs), data_dir=data_dir, sigma_s=sigma_s if reads_file else None,
                 out=out, evaluate=True, max_length=task_max_length(config, task),
                 mixed_precision=config["training"]["mixed_precision"])


def aggregate_options(config: dict) -> list[str]:
    """The aggregate's settings, as its command's options: the ``inference`` section (the rule for collapsed
    runs, the multiplicity plan, the paper's models, the primary endpoint), and the analysis settings every
    measurement it reads must carry (``--analysis``: a measurement made under another ζ or Σ_S reference is
    refused, not mixed in)."""
    analysis = config["analysis"]
    measured = {"zeta": analysis["zeta"], "sigma_s_model": analysis["sigma_s_model"]}
    return ["--inference", json.dumps(config["inference"], sort_keys=True),
            "--analysis", json.dumps(measured, sort_keys=True)]


# ----------------------------------------------------------------------------- isotropy profiles

def survey_targets(config: dict) -> list[tuple[str, str]]:
    """(model short name, revision label) of every profile the ``survey`` section asks for."""
    return [(name, revision) for name, entry in config["survey"]["models"].items()
            for revision in (entry.get("revisions") or [AS_GIVEN])]


def survey_text_task(config: dict) -> str | None:
    """The task whose prepared split is the profiles' text sample, or None when ``survey.text`` is a file."""
    text = config["survey"]["text"]
    return text if text in TASKS else None


def survey_spec(config: dict, *, model: str, revision: str, text: str, out: str) -> SurveySpec:
    """One model × revision profile; ``text``: the prepared task folder or the text file."""
    entry = config["survey"]["models"][model]
    return _spec(SurveySpec, config, model=entry["source"], revision=None if revision == AS_GIVEN else revision,
                 trust_remote_code=entry["trust_remote_code"], text=text, out=out,
                 # a job granted no GPU stays on the CPU even on a machine that has one
                 device="auto" if config["survey"]["gpus"] else "cpu")
