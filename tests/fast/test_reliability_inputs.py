"""Damaged inputs and silent wrong results (issue 24): each case is named, early, with the fix.

(The cases that need Snakemake are in tests/e2e/test_reliability_inputs_workflow.py.)

Every test damages a real file (a copy of the packaged MiniLM, the packaged GGUF decoder, a Σ_S
file, a run folder written by ``istar train``) and runs the project's own entry points on it.
"""

import json
import os
import stat

import pytest
import torch
from reliability_inputs_helpers import (
    DEMO_DATA,
    accumulators,
    copied_run,
    cut_minilm,
    default_config,
    finished_run,
    nan_sigma,
    smollm,
)

from istar.config.schema import ConfigError
from istar.io import artifacts
from istar.io.artifacts import DamagedArtifactError
from istar.pipeline.validate import validate_config


def test_truncated_pretrained_model_is_named_by_config_validation(cut_minilm):
    with pytest.raises(ConfigError) as error:
        validate_config(default_config(models={"minilm": str(cut_minilm)}))
    message = str(error.value)
    assert message.startswith("config key 'models.minilm'")
    assert f"{cut_minilm / 'model.safetensors'} is incomplete" in message and "download it again" in message


def test_complete_gguf_passes_the_check(smollm):
    from istar.models.files import gguf_problem

    assert gguf_problem(smollm) is None


def test_non_finite_sigma_is_not_written(tmp_path):
    from istar.core.shrinkage import save_shrinkage

    path = tmp_path / "sigma0.pt"
    per_layer = accumulators()
    per_layer[2].m2[0, 0] = float("inf")  # statistics merged from another process, say
    with pytest.raises(ValueError, match=f"Σ_S for {path} is not finite .*nothing was written"):
        save_shrinkage(path, per_layer, [1, 2], {"model": "tiny"})
    assert not path.exists() and not list(tmp_path.iterdir())


def test_non_finite_sigma_is_named_where_it_is_read(nan_sigma):
    from istar.core.shrinkage import load_shrinkage

    with pytest.raises(DamagedArtifactError) as error:
        load_shrinkage(nan_sigma)
    assert f"{nan_sigma} is damaged (it holds NaN or inf in per_layer.m2" in str(error.value)
    assert f"snakemake --forcerun {nan_sigma}" in str(error.value)


def test_a_damaged_sigma_given_to_the_library_names_a_library_fix(nan_sigma):
    from transformers import BertModel

    from fixture_parts import tiny_bert_config
    from istar import IStarConfig

    model = BertModel(tiny_bert_config(hidden_size=32, num_hidden_layers=2))
    with pytest.raises(DamagedArtifactError, match=r"is damaged \(it holds NaN or inf in per_layer.m2.*\): write it "
                                                   r"again with `istar shrinkage`, or give IStarConfig\(sigma_s=istar"):
        IStarConfig(lam=-1.0, sigma_s=nan_sigma).given_sigma_s(model)


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


def test_a_split_with_another_row_count_than_the_official_one_is_refused(tmp_path):
    from istar.data import IncompleteSplitError, prepare_task

    with pytest.raises(IncompleteSplitError) as error:
        prepare_task("rte", tmp_path / "rte", source="mirror", mirror=DEMO_DATA)
    assert (f"{DEMO_DATA.resolve() / 'glue/RTE/train.tsv'} holds 64 rows, but the official RTE train split has 2,490"
            in str(error.value)) and "data.subset: true" in str(error.value)
    assert not (tmp_path / "rte").exists()
    meta = prepare_task("rte", tmp_path / "rte", source="mirror", mirror=DEMO_DATA, subset=True)
    assert meta["subset"] is True and meta["rows"] == {"train": 64, "validation": 64}
