"""The results layout: one grammar for every path a step writes and the workflow asks for.

    resources/data/{task}                                  prepared splits (+ meta.json)
    resources/models/{model}.json                          a model source pinned to its commit
    resources/shrinkage/{model}/{task}/sigma0.pt           Σ_S of the pretrained model (real tokens;
                                                           sigma0_allpos.pt: every padded position)
    results/search/{model}/{task}/{setting}/seed{seed}     a search run
    resources/data/{task}/{heldout}                        the held-out selection split (search part + held-out rows)
    resources/shrinkage/{model}/{task}/{heldout}/sigma0.pt Σ_S of the search part
    results/search/{heldout}/{model}/{task}/{setting}/seed{seed}
                                                           a search run scored on the held-out rows
    results/runs/{model}/{task}/{setting}/seed{seed}       a final or study run
    results/selection/{model}/{task}/best.json             the search's choice (or the λ | ζ fixed in advance)
    results/selection/{model}/{task}/padding.json          the padding study's own tuning choice
    results/measures/{model}/{task}/{setting}/seeds{seeds}.json
                                                           evaluation + analysis of a setting's runs
    results/profile/{pmodel}/{revision}.json               an isotropy profile
    results/aggregate/{name}.csv                           the aggregate tables
    logs/{rule's folder}/…/{job}.log                       a job's log (benchmarks/…/{job}.tsv: its timing)

A *setting* is a fine-tuning method with its hyperparameters, spelled as a folder name:
``base``, ``cosreg_lam1``, ``istar_lam-1_zeta0.2``, ``istar_lam-1_zeta0.2_layer6``, plus
``_allpos`` when the penalty and Σ_S read every padded position (``penalty.tokens``; the default,
real tokens, adds nothing) and ``_bs16_ep3_lr3e-05`` when the search grid covers batch size,
epochs and learning rate.
Hyperparameters in paths keep reruns right even without Snakemake's metadata and make every
artifact self-describing. :class:`Setting` formats and parses that name, :func:`parse_run_dir`
reads a run folder back; the Snakemake rules format the templates below and constrain their
wildcards with :data:`WILDCARD_CONSTRAINTS`. Nothing else spells a result path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from istar.core.tokens import TOKEN_SELECTION_NAMES, TOKEN_SELECTIONS, get_token_selection
from istar.registry.methods import METHOD_PATTERN, get_method

__all__ = ["Setting", "RunPath", "format_number", "parse_run_dir", "seed_of", "seeds_token", "DATA", "MODEL_PIN", "SIGMA",
           "SIGMA_ALL_POSITIONS", "sigma_template", "DEFAULT_TOKENS", "SEARCH_RUN", "heldout_folder", "search_templates",
           "RUN", "SELECTION", "TUNED_SELECTION", "COLLAPSE_CHECK", "MEASURES", "PROFILE", "AGGREGATE_DIR", "AGGREGATE",
           "EXPERIMENT_METRICS", "RESOLVED_CONFIG", "TABLE", "FIGURE", "SUMMARY_MD", "SUMMARY_RST", "WILDCARD_CONSTRAINTS",
           "TRAIN_LOG", "search_log", "MEASURE_LOG", "SELECT_LOG", "SELECT_TUNED_LOG", "AGGREGATE_LOG", "EXPERIMENT_LOG",
           "STABILITY_LOG", "TABLE_LOG", "FIGURE_LOG", "SUMMARY_LOG", "shrinkage_log", "benchmark_of"]

DATA = "resources/data/{task}"
MODEL_PIN = "resources/models/{model}.json"
SHRINKAGE = "resources/shrinkage/{model}/{task}/"


def sigma_template(tokens: str, heldout: str | None = None) -> str:
    """The pretrained Σ_S of a token selection: ``…/sigma0.pt`` (real tokens), ``…/sigma0_allpos.pt``;
    in the held-out split's folder (``…/{heldout}/sigma0.pt``) when ``heldout`` names one
    (:func:`heldout_folder`): the Σ_S of the search part, for the search runs."""
    folder = f"{SHRINKAGE}{heldout}/" if heldout else SHRINKAGE
    return f"{folder}sigma0{get_token_selection(tokens).suffix}.pt"


SIGMA = sigma_template("real")
SIGMA_ALL_POSITIONS = sigma_template("all_positions")
SEARCH_RUN = "results/search/{model}/{task}/{setting}/seed{seed}"
RUN = "results/runs/{model}/{task}/{setting}/seed{seed}"
SELECTION = "results/selection/{model}/{task}/best.json"
TUNED_SELECTION = "results/selection/{model}/{task}/padding.json"
# which final seeds collapsed and the seeds that replace them (inference.collapsed_runs: rerun)
COLLAPSE_CHECK = "results/collapse/{model}/{task}.json"
# one file per setting and set of seeds (seeds0_1_2): the studies that ask for the same setting
# and seeds share it
MEASURES = "results/measures/{model}/{task}/{setting}/seeds{seeds}.json"
PROFILE = "results/profile/{pmodel}/{revision}.json"
AGGREGATE_DIR = "results/aggregate"
AGGREGATE = AGGREGATE_DIR + "/{name}.csv"
EXPERIMENT_METRICS = "results/experiment/metrics.json"
RESOLVED_CONFIG = "results/config.yaml"  # the study's config with every default filled in
TABLE = "results/tables/{table}"  # .csv, .md, .tex
FIGURE = "results/figures/{figure}"  # .png, .pdf
SUMMARY_MD = "results/summary.md"
SUMMARY_RST = "results/summary.rst"


# The logs of the jobs of a model × task (istar.pipeline.jobs); each job's benchmark file is its log's
# path under benchmarks/ (:func:`benchmark_of`).
TRAIN_LOG = "logs/finetune/{model}/{task}/{setting}/seed{seed}.log"
MEASURE_LOG = "logs/measure/{model}/{task}/{setting}/seeds{seeds}.log"
SELECT_LOG = "logs/select/{model}/{task}.log"
SELECT_TUNED_LOG = "logs/select_tuned/{model}/{task}.log"
# ... and of the study's jobs after the measurements
AGGREGATE_LOG = "logs/aggregate/aggregate.log"
EXPERIMENT_LOG = "logs/aggregate/experiment.log"
STABILITY_LOG = "logs/stability.log"
TABLE_LOG = "logs/table/{table}.log"
FIGURE_LOG = "logs/figure/{figure}.log"
SUMMARY_LOG = "logs/summary.log"


def search_log(heldout: str | None) -> str:
    """A search run's log (in the held-out split's folder under ``search.selection_split: heldout``)."""
    return TRAIN_LOG.replace("logs/finetune/", f"logs/finetune_search/{heldout + '/' if heldout else ''}")


def shrinkage_log(tokens: str, heldout: str | None = None) -> str:
    """The log of the Σ_S job of a token selection (of the search part when ``heldout`` names one)."""
    return f"logs/shrinkage/{heldout + '/' if heldout else ''}{{model}}/{{task}}{get_token_selection(tokens).suffix}.log"


def benchmark_of(log: str) -> str:
    """The benchmark file (Snakemake's timing of the job) beside a log template: benchmarks/….tsv."""
    return "benchmarks/" + log.removeprefix("logs/").removesuffix(".log") + ".tsv"


def heldout_folder(fraction: float, seed: int) -> str:
    """The ``{heldout}`` part of the held-out selection split's paths: ``heldout0.2_seed0``."""
    return f"heldout{format_number(fraction)}_seed{int(seed)}"


def search_templates(heldout: str | None) -> tuple[str, str, str]:
    """(data, Σ_S, run) templates of the search: the task's own data, Σ_S and ``results/search/…``
    when ``heldout`` is None (the validation protocol), else the held-out split's (``heldout`` from
    :func:`heldout_folder`)."""
    if heldout is None:
        return DATA, SIGMA, SEARCH_RUN
    return (f"{DATA}/{heldout}", sigma_template("real", heldout),
            SEARCH_RUN.replace("results/search/", f"results/search/{heldout}/"))

WILDCARD_CONSTRAINTS = {
    "model": "[A-Za-z0-9][A-Za-z0-9.-]*",
    "setting": f"({METHOD_PATTERN})[A-Za-z0-9.e_+-]*",
    "seed": "[0-9]+",
    "seeds": "[0-9]+(_[0-9]+)*",
    "pmodel": "[A-Za-z0-9][A-Za-z0-9.-]*",
    "revision": "[A-Za-z0-9][A-Za-z0-9._-]*",
}
"""Regular expressions of the wildcards (``task`` is the configured tasks' alternation)."""

_NUMBER = r"-?[0-9][0-9.e+-]*"
_TOKEN_SUFFIXES = {selection.suffix: key for key, selection in TOKEN_SELECTIONS.items() if selection.suffix}
_PATTERN = re.compile(
    rf"^(?P<method>{METHOD_PATTERN})(?:_lam(?P<lam>{_NUMBER}))?(?:_zeta(?P<zeta>{_NUMBER}))?"
    rf"(?:_layer(?P<layer>[0-9]+))?(?P<tokens>{'|'.join(_TOKEN_SUFFIXES)})?"
    rf"(?:_bs(?P<bs>[0-9]+)_ep(?P<ep>[0-9]+)_lr(?P<lr>{_NUMBER}))?$")
DEFAULT_TOKENS = TOKEN_SELECTION_NAMES[0]


def format_number(value: float) -> str:
    """Shortest exact spelling of a hyperparameter: 1.0 → '1', -0.5 → '-0.5', 3e-05 → '3e-05'."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


@dataclass(frozen=True)
class Setting:
    """A method and its hyperparameters; ``None`` means the configuration's training default."""

    method: str
    lam: float = 0.0
    zeta: float | None = None
    layer: int | None = None
    tokens: str = DEFAULT_TOKENS
    batch_size: int | None = None
    epochs: int | None = None
    learning_rate: float | None = None

    @property
    def name(self) -> str:
        parts = [self.method]
        method = get_method(self.method)
        if method.takes("lam"):
            parts.append(f"lam{format_number(self.lam)}")
        if method.takes("zeta"):
            parts.append(f"zeta{format_number(self.zeta)}")
            if self.layer is not None:
                parts.append(f"layer{self.layer}")
        name = "_".join(parts) + (get_token_selection(self.tokens).suffix if method.takes("tokens") else "")
        if self.batch_size is not None:
            name += f"_bs{self.batch_size}_ep{self.epochs}_lr{format_number(self.learning_rate)}"
        return name

    @classmethod
    def parse(cls, name: str) -> "Setting":
        match = _PATTERN.match(name)
        if match is None:
            raise ValueError(f"cannot read the setting {name!r}: expected e.g. base, cosreg_lam1, istar_lam-1_zeta0.2")
        g = match.groupdict()
        setting = cls(
            method=g["method"], lam=float(g["lam"]) if g["lam"] else 0.0,
            zeta=float(g["zeta"]) if g["zeta"] else None, layer=int(g["layer"]) if g["layer"] else None,
            tokens=_TOKEN_SUFFIXES[g["tokens"]] if g["tokens"] else DEFAULT_TOKENS, batch_size=int(g["bs"]) if g["bs"] else None, epochs=int(g["ep"]) if g["ep"] else None,
            learning_rate=float(g["lr"]) if g["lr"] else None)
        if setting.name != name:
            raise ValueError(f"setting {name!r} is not in canonical form; write it as {setting.name!r}")
        return setting

    def with_training(self, other: "Setting") -> "Setting":
        """This method with the batch size, epochs and learning rate of ``other``."""
        return replace(self, batch_size=other.batch_size, epochs=other.epochs, learning_rate=other.learning_rate)


@dataclass(frozen=True)
class RunPath:
    """A run folder read back: ``…/{model}/{task}/{setting}/seed{seed}``."""

    model: str
    task: str
    setting: str
    seed: int


_SEED = re.compile(r"seed([0-9]+)")


def seed_of(folder_name: str) -> int | None:
    """The seed a ``seed{n}`` folder name spells, or None for another name."""
    match = _SEED.fullmatch(folder_name)
    return int(match.group(1)) if match else None


def parse_run_dir(run_dir) -> RunPath | None:
    """The parts of a run folder in the layout (search or final), or None for a folder outside it."""
    parts = Path(run_dir).parts
    seed = seed_of(parts[-1]) if parts else None
    if seed is None or len(parts) < 5:
        return None
    return RunPath(model=parts[-4], task=parts[-3], setting=parts[-2], seed=seed)


def seeds_token(seeds) -> str:
    """The ``{seeds}`` part of a measurement file: the distinct seeds, ascending, joined by ``_``."""
    return "_".join(str(seed) for seed in sorted(set(int(seed) for seed in seeds)))
