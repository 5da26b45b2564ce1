"""The report's landing page (istar.report.summary): the verdict first, and every sentence about what ran true
to the config and the records (no search without a search, no CosReg without CosReg runs, the selection-bias
sentence only under a validation-split search)."""

import math

import numpy as np
import pandas as pd
import pytest
from docutils.core import publish_parts

from istar.config.schema import STUDIES, load_yaml
from istar.pipeline.plan import fixed_setting, final_settings, search_settings, study_runs, study_seeds
from istar.pipeline.validate import validate_config
from istar.registry.methods import get_method
from istar.registry.tasks import get_task
from istar.report.aggregate import RUNS_COLUMNS, SELECTION_COLUMNS
from istar.report.summary import landing, write_summary


def records(config: dict, collapsed_seeds=()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs.csv and selection.csv as the workflow would write them for ``config``: every run its plan names
    (istar.pipeline.plan), with seeded scores; the search's first setting stands for its choice. The final
    runs on ``collapsed_seeds`` score the trivial predictor's accuracy (collapsed)."""
    rng = np.random.default_rng(0)
    rows, selection = [], []

    def add(study, model, task, setting, seed):
        collapsed = study == "final" and seed in collapsed_seeds
        score = 0.5 if collapsed else 0.8 + 0.02 * rng.standard_normal()
        rows.append({**dict.fromkeys(RUNS_COLUMNS, math.nan), "study": study, "model": model, "task": task,
                     "method": setting.method, "setting": setting.name, "lam": setting.lam,
                     "zeta": setting.zeta if get_method(setting.method).takes("zeta") else math.nan,
                     "tokens": setting.tokens, "seed": seed, "metric": get_task(task).metric, "score": score,
                     get_task(task).metric: score, "trivial_score": 0.5, "collapsed": collapsed, "standin": False,
                     "isoscore_star": 0.2 + 0.01 * rng.standard_normal(), "isoscore": 0.1,
                     "cosine_similarity": 0.3, "run_dir": f"results/runs/{model}/{task}/{setting.name}/seed{seed}"})

    for model in config["models"]:
        for task in config["tasks"]:
            chosen = fixed_setting(config, model, task)
            protocol, settings = "fixed", 0
            if chosen is None:
                searched = search_settings(config, model, task)
                for setting in searched:
                    for seed in config["search"]["seeds"]:
                        add("search", model, task, setting, seed)
                chosen, protocol, settings = searched[0], config["search"]["selection_split"], len(searched)
            heldout = protocol == "heldout"
            selection.append({**dict.fromkeys(SELECTION_COLUMNS, math.nan), "model": model, "task": task,
                              "metric": get_task(task).metric, "lam": chosen.lam, "zeta": chosen.zeta,
                              "protocol": protocol, "settings": settings, "standin": False,
                              "heldout_fraction": config["search"]["heldout_fraction"] if heldout else math.nan,
                              "heldout_seed": config["search"]["heldout_seed"] if heldout else math.nan})
            for setting in final_settings(config, chosen):
                for seed in study_seeds(config, "final", task):
                    add("final", model, task, setting, seed)
            tuned = type(chosen)("istar", lam=-1.0, zeta=0.2, tokens="real")
            for study in STUDIES:
                for setting, seed in study_runs(config, study, model, task, chosen, num_layers=6, tuned=tuned) or []:
                    add(study, model, task, setting, seed)
    return pd.DataFrame(rows, columns=list(RUNS_COLUMNS)), pd.DataFrame(selection, columns=list(SELECTION_COLUMNS))


def load_config(path) -> dict:
    """A shipped config, validated without looking at the disk or the hub (the model is not loaded)."""
    return validate_config(load_yaml(path), check_paths=False)


def what_ran(page) -> str:
    return " ".join(f"{label}: {text}" for label, text in page.what_ran)


@pytest.fixture(scope="module")
def studies():
    """The three shipped studies' configs, records and landing pages, built once: the demo (a validation-split
    search, CosReg, figure studies), the GPU study (confirmatory: λ | ζ fixed, Base and I-STAR, seed 3 collapsed)
    and the CPU study (confirmatory with the padding study)."""
    built = {}
    for name, path, collapsed in (("demo", "config/config.yaml", ()), ("gpu", "config/gpu-study.yaml", {3}),
                                  ("padding", "config/cpu-study.yaml", ())):
        config = load_config(path)
        runs, selection = records(config, collapsed_seeds=collapsed)
        built[name] = (config, runs, selection, landing(config, runs, selection))
    return built


def test_demo_landing_names_its_search_its_bias_and_cosreg(studies):
    page = studies["demo"][3]
    text = what_ran(page)
    assert "validation split that the table reports" in text and "biased upward" in text
    assert "The search trained 4 settings on seed(s) 0 (8 runs)." in text  # 2 λ × 2 ζ on each of 2 tasks
    assert "CosReg (RTE λ = 1" in text and "I-STAR (RTE λ = -1 | ζ = 0.2" in text
    assert "lambda_sweep" in text and "padding" not in text
    assert "Primary endpoint: none declared" in text
    assert "What ran: precision not recorded by 6 of 6 runs; threads not recorded" in text  # runs before the record
    assert page.verdict.name == "claims" and "Collapsed runs" in page.collapsed and page.collapsed.endswith("none.")


def test_confirmatory_landing_has_no_search_no_cosreg_and_no_bias_sentence(studies):
    page = studies["gpu"][3]
    text = what_ran(page)
    assert "fixed in advance" in text and "no selection bias from this study" in text
    assert "The search trained" not in text and "biased upward" not in text and "validation split" not in text
    assert "CosReg" not in text and "Studies beside" not in text
    assert "SST-2 (accuracy), 10 seeds (0–9)" in text and "MRPC (accuracy), 10 seeds (0–9)" in text
    assert "batch 32 × 2 accumulated" in text and "3 epochs" in text
    # seed 3 collapsed in both arms of both cells, counted per arm under the declared rule (keep)
    assert "inference.collapsed_runs: keep" in page.collapsed
    assert "minilm SST-2 (Base 1 of 10; I-STAR 1 of 10)" in page.collapsed
    # what the runs record they ran with, from runs.csv, beside the precision the config requested
    config, runs, selection, _ = studies["gpu"]
    final = runs["study"] == "final"
    runs = runs.assign(precision="bf16", threads=2, code_sha256="c0de" * 16)
    runs.loc[final & (runs["seed"] == 9), ["precision", "threads", "code_sha256"]] = math.nan
    text = what_ran(landing(config, runs, selection))
    assert "What ran: precision bf16 (36 runs); not recorded by 4 of 40 runs; threads 2 (36 runs);" in text
    assert "code c0dec0dec0de (36 runs)" in text


def test_padding_landing_names_the_padding_study_and_the_token_selection(studies):
    text = what_ran(studies["padding"][3])
    assert "padding (" in text and "Real-token IsoScore* against performance" in text
    assert "penalty over all positions" in text and "fixed in advance" in text
    assert "The search trained" not in text and "CosReg" not in text
    assert "SST-2 (accuracy), 20 seeds (0–19); MRPC (accuracy), 5 seeds (0–4)" in text
    assert "seeded subsamples: at most 3,000 training examples" in text


@pytest.mark.parametrize("name", ["demo", "gpu", "padding"])
def test_the_summary_files_open_with_the_verdict_and_the_rst_is_clean(name, studies, tmp_path):
    import yaml

    config, runs, selection, _ = studies[name]
    aggregate = tmp_path / "aggregate"
    aggregate.mkdir()
    runs.to_csv(aggregate / "runs.csv", index=False)
    selection.to_csv(aggregate / "selection.csv", index=False)
    if config["studies"]["stability"]["enabled"]:
        pd.DataFrame({"batch_size": [8, 64, 8, 64], "zeta": [0.0, 0.0, 0.5, 0.5], "mean": [0.3, 0.5, 0.6, 0.6],
                      "std": [0.05, 0.02, 0.01, 0.01]}).to_csv(aggregate / "fig2_stability.csv", index=False)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    write_summary(tmp_path / "config.yaml", aggregate, tmp_path / "summary.md", tmp_path / "summary.rst")
    md = (tmp_path / "summary.md").read_text()
    assert md.index("## Verdict") < md.index("| Claim") < md.index("## What ran")
    rst = (tmp_path / "summary.rst").read_text()
    # docutils stops at the first warning: a table or a line it cannot read fails here, not in the report
    html = publish_parts(rst, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})["html_body"]
    assert html.index("Verdict") < html.index("What ran")
    assert md.count("\n- **") == rst.count("\n- **")
