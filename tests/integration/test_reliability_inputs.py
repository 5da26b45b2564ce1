"""Damaged inputs and silent wrong results (issue 24): each case is named, early, with the fix.

(The cases that need Snakemake are in tests/e2e/test_reliability_inputs_workflow.py.)

Every test damages a real file (a copy of the packaged MiniLM, the packaged GGUF decoder, a Σ_S
file, a run folder written by ``istar train``) and runs the project's own entry points on it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mirrors import REPO
from reliability_inputs_helpers import (
    DEMO_DATA,
    copied_run,
    cut_minilm,
    default_config,
    finished_run,
    nan_sigma,
    smollm,
)

from istar.config.schema import ConfigError
from istar.io import artifacts
from istar.pipeline.validate import validate_config


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def istar_cli(*args):
    return subprocess.run([sys.executable, "-m", "istar", *map(str, args)], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def one_line_error(result, *needles):
    """The command failed with one ``istar …: error:`` line holding every needle, and no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, result.stderr[-2000:]
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def cut(source: Path, target: Path, size: int) -> Path:
    with open(source, "rb") as handle:
        target.write_bytes(handle.read(size))
    return target


def test_truncated_pretrained_model_is_named_at_load(cut_minilm, prepared, tmp_path):
    result = istar_cli("train", "--model", cut_minilm, "--data", prepared("rte"), "--out", tmp_path / "run",
                       "--epochs", 1)
    one_line_error(result, cut_minilm / "model.safetensors", "is incomplete")
    # the output folder may exist (its writability is checked first), but nothing was written in it
    assert not list((tmp_path / "run").glob("**/*"))


@pytest.mark.parametrize("keep", [1000, 50_000_000], ids=["inside-the-header", "inside-the-weights"])
def test_truncated_gguf_is_named_by_config_validation_and_at_load(smollm, tmp_path, keep):
    short = cut(smollm, tmp_path / "decoder.gguf", keep)
    config = default_config()
    config["survey"] = {"models": {"smol": {"source": str(short)}}, "text": "rte"}
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert str(error.value).startswith("config key 'survey.models.smol.source'")
    assert f"{short} is incomplete" in str(error.value)
    text = tmp_path / "text.txt"
    text.write_text("One short document.\nAnother one.\n")
    result = istar_cli("survey", "--model", short, "--text", text, "--out", tmp_path / "survey.json", "--device", "cpu")
    one_line_error(result, short, "is incomplete", "download it again")


def test_train_refuses_a_non_finite_sigma_before_saving_a_copy(nan_sigma, tiny_model_dir, prepared, tmp_path):
    out = tmp_path / "run"
    result = istar_cli("train", "--model", tiny_model_dir, "--data", prepared("rte"), "--out", out,
                       "--method", "istar", "--lam", -1, "--sigma-s", nan_sigma, "--epochs", 1)
    one_line_error(result, nan_sigma, "NaN or inf")
    assert not (out / "sigma_epoch0.pt").exists()


def test_shrinkage_of_a_model_with_nan_weights_writes_nothing(tiny_model_dir, prepared, tmp_path):
    from transformers import BertModel

    broken = tmp_path / "broken"
    model = BertModel.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.embeddings.LayerNorm.weight[0] = float("nan")
    model.save_pretrained(broken)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, broken / name)
    out = tmp_path / "sigma0.pt"
    result = istar_cli("shrinkage", "--model", broken, "--data", prepared("rte"), "--out", out, "--rows", 1000)
    one_line_error(result, f"Σ_S for {out} is not finite: hidden state 0 of the model holds NaN", "nothing was written")
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_aggregate_cli_names_an_edited_metrics_file(finished_run, tmp_path):
    run = copied_run(finished_run, tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["final"]["accuracy"] = 0.99
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2))
    result = istar_cli("aggregate", "--out-dir", tmp_path / "aggregate", f"final={run}")
    one_line_error(result, f"{run / 'metrics.json'} is damaged")
    assert not (tmp_path / "aggregate").exists() or not list((tmp_path / "aggregate").iterdir())


def test_measure_refuses_a_run_folder_holding_two_runs(finished_run, tiny_model_dir, prepared, tmp_path):
    run = copied_run(finished_run, tmp_path)
    out = tmp_path / "measures.json"
    command = ("measure", "--runs", run, "--data", prepared("rte"), "--sigma-s", finished_run["sigma"], "--out", out)
    # the saved state of another setting's training beside the finished outputs
    state = run / "resume" / "state-00000003"
    state.mkdir(parents=True)
    (state / "COMPLETE").write_text("step 3\n")
    one_line_error(istar_cli(*command), f"run folder {run} holds a saved training state (resume/state-00000003)")
    shutil.rmtree(run / "resume")
    # another run's model/ beside these metrics
    shutil.rmtree(run / "model")
    shutil.copytree(tiny_model_dir, run / "model")
    artifacts.record_digests(run / "model")
    one_line_error(istar_cli(*command), f"run folder {run} mixes two runs: {run / 'model'} is not the model")
    assert not out.exists()


def test_measure_names_a_non_finite_sigma_before_evaluating(finished_run, nan_sigma, prepared, tmp_path):
    run = copied_run(finished_run, tmp_path)
    out = tmp_path / "measures.json"
    result = istar_cli("measure", "--runs", run, "--data", prepared("rte"), "--sigma-s", nan_sigma, "--out", out,
                       "--evaluate")
    one_line_error(result, nan_sigma, "NaN or inf")
    assert "IsoScore*" not in result.stdout and not out.exists()


def test_a_mirror_file_cut_at_a_line_end_is_refused_by_prepare_data(tmp_path):
    mirror = tmp_path / "mirror"
    shutil.copytree(DEMO_DATA, mirror)
    # what a copy cut short at a line end looks like: a complete file in every other respect
    train = mirror / "glue" / "RTE" / "train.tsv"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:41]))
    result = subprocess.run([sys.executable, "-m", "istar", "prepare-data", "--task", "rte", "--source", "mirror",
                             "--mirror", mirror, "--out", tmp_path / "rte"], env=ENV, cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: {train} holds 40 rows, but the official RTE train split has 2,490" in result.stderr
