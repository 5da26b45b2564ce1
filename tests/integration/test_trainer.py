"""The shipped ``transformers.Trainer`` integration, trained for real: the packaged MiniLM on a few SST-2 rows of
tests/data (short sequences, a few optimizer steps, one process, CPU), and under accelerate with two gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mirrors import REPO
from trainer_helpers import training_logs
from trainer_runs import trainer_for

import istar

SUPPORT = REPO / "tests" / "support"


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """I-STAR λ = −1, λ = +1 and the base run (λ = 0: no gradient from the penalty, IsoScore* still logged),
    2 epochs × 3 optimizer steps of 8 sentences, the same seed."""
    runs = {}
    for name, lam in (("lower", -1.0), ("base", 0.0), ("raise", 1.0)):
        trainer = trainer_for(tmp_path_factory.mktemp(name), istar.IStarConfig(lam=lam, zeta=0.2, shrinkage_rows=1000))
        trainer.train()
        runs[name] = trainer
    return runs


def test_the_penalty_moves_the_logged_isoscore_star_against_the_base_run(three_runs):
    logs = {name: training_logs(trainer) for name, trainer in three_runs.items()}
    assert [len(entries) for entries in logs.values()] == [6, 6, 6]
    first = [entries[0]["isoscore_star"] for entries in logs.values()]
    assert max(first) - min(first) < 1e-6, first  # the same seed: the same model and batch at step 1
    late = {name: np.mean([entry["isoscore_star"] for entry in entries[-3:]]) for name, entries in logs.items()}
    assert late["lower"] < late["base"] < late["raise"], late
    for entries in logs.values():  # the Trainer's loss is the task loss plus the penalty, micro-batch means
        for entry in entries:
            assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["istar_penalty"], abs=1e-4), entry
    assert all(entry["istar_penalty"] == 0.0 for entry in logs["base"])


# three Trainer runs in the module's fixture: a minute or more
def test_sigma_is_computed_before_training_and_at_each_epoch(three_runs):
    trainer = three_runs["lower"]
    refreshes = [entry for entry in trainer.state.log_history if "sigma_s_isoscore" in entry]
    assert [entry["step"] for entry in refreshes] == [0, 3]
    assert trainer.sigma_epoch == 1 and trainer.sigma_s.shape == (384, 384) and trainer.sigma_s.dtype == torch.float64
    assert 0 < refreshes[0]["sigma_s_isoscore"] < 1 and refreshes[0]["sigma_s_isoscore"] != refreshes[1]["sigma_s_isoscore"]


# three Trainer runs in the module's fixture: a minute or more
def test_evaluate_and_compute_metrics_are_untouched(three_runs):
    """Evaluation asks for no hidden states, so the predictions compute_metrics gets are the logits alone."""
    result = three_runs["lower"].evaluate()
    assert 0.0 <= result["eval_accuracy"] <= 1.0 and np.isfinite(result["eval_loss"])
    prediction = three_runs["raise"].predict(three_runs["raise"].eval_dataset)
    assert prediction.predictions.shape == (16, 2)


def test_two_gloo_ranks_share_sigma_and_log_the_global_penalty(tmp_path):
    """``accelerate launch`` with two CPU processes: Σ_S merged to the same matrix on both ranks, the global
    penalty's IsoScore* logged, evaluate() with compute_metrics on the sharded split."""
    from services import ACCELERATE_2_CPU

    launcher = [str(Path(sys.executable).parent / ACCELERATE_2_CPU[0]), *ACCELERATE_2_CPU[1:-2]]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    result = subprocess.run([*launcher, str(SUPPORT / "trainer_two_ranks.py"), str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    assert ranks[0]["sigma_checksum"] == ranks[1]["sigma_checksum"]
    logs = ranks[0]["logs"]
    assert logs and all(0 < entry["isoscore_star"] < 1 for entry in logs)
    assert 0.0 <= ranks[0]["eval_accuracy"] <= 1.0


def _parameters(trainer) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.model.named_parameters()}


def _differing(first: dict, second: dict) -> list[str]:
    return [name for name in first if not torch.equal(first[name], second[name])]


# two Trainer runs of 4 steps, a Σ_S pass at each epoch's start
def test_lambda_zero_trains_the_same_parameters_with_and_without_sigma(tmp_path):
    """The Σ_S pass runs in a forked random state: λ = 0 with ζ > 0 (two Σ_S passes, one before the first
    step and one at epoch 2) ends on exactly the parameters of λ = 0 with ζ = 0 (no Σ_S), dropout on."""
    runs = {}
    for zeta in (0.0, 0.2):
        trainer = trainer_for(tmp_path / str(zeta), istar.IStarConfig(lam=0.0, zeta=zeta, shrinkage_rows=1000), max_steps=4)
        trainer.train()
        runs[zeta] = _parameters(trainer)
    assert runs[0.2]["classifier.weight"].abs().sum() > 0
    assert _differing(runs[0.0], runs[0.2]) == []


# three Trainer runs: 6 steps, then 4 resumed steps, checkpoints written
def test_a_run_resumed_from_a_checkpoint_ends_on_the_same_parameters(tmp_path):
    """Checkpoint at step 2 (epoch 1 of 2, Σ_S of epoch 1 saved in it), resumed in a fresh Trainer: the
    last parameters equal the uninterrupted run's bit for bit, through the Σ_S refresh of epoch 2."""
    config = istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=1000)
    whole = trainer_for(tmp_path / "whole", config, save_strategy="steps", save_steps=2)
    whole.train()
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    saved_epoch = torch.load(checkpoint / "istar_sigma_s.pt", weights_only=True)["sigma_epoch"]
    # the checkpoint names its settings and its Σ_S's origin beside the weights, as IStarModel's folders do
    settings = json.loads((checkpoint / "istar_config.json").read_text())
    assert settings["istar"]["lam"] == -1.0 and settings["istar"]["zeta"] == 0.2
    assert settings["sigma_s"] == {"from": "the model over train_dataset", "epoch": saved_epoch, "shape": [384, 384]}
    resumed = trainer_for(tmp_path / "resumed", config)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.sigma_epoch == 1
    assert _differing(_parameters(whole), _parameters(resumed)) == []
    resumed.save_model(str(tmp_path / "final"))
    origin = str(checkpoint / "istar_sigma_s.pt") if saved_epoch == 1 else "the model over train_dataset"
    assert json.loads((tmp_path / "final" / "istar_config.json").read_text())["sigma_s"]["from"] == origin


# a Σ_S pass for the file, then 4 steps across an epoch
def test_a_sigma_file_of_istar_shrinkage_is_kept_when_no_refresh_is_asked(tmp_path):
    """The file `istar shrinkage` writes (save_shrinkage of the pretrained model's statistics), given as
    IStarConfig(sigma_s=path, recompute_shrinkage=False): trained with through epoch 2, never recomputed."""
    from istar.core.shrinkage import save_shrinkage
    from istar.models.shrinkage import accumulate_shrinkage

    probe = trainer_for(tmp_path / "probe", istar.IStarConfig(lam=-1.0))
    per_layer = accumulate_shrinkage(probe.model, probe.get_eval_dataloader(probe.train_dataset), "all", 300,
                                     progress=False)
    save_shrinkage(tmp_path / "sigma.safetensors", per_layer, list(range(1, 7)), {"model": "minilm"})
    config = istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=tmp_path / "sigma.safetensors", recompute_shrinkage=False)
    expected = config.given_sigma_s(probe.model)
    trainer = trainer_for(tmp_path / "run", config, max_steps=4)
    trainer.train()
    assert trainer.sigma_epoch == 0 and torch.equal(trainer.sigma_s, expected)
    assert len([entry for entry in trainer.state.log_history if "sigma_s_isoscore" in entry]) == 1
    assert len(training_logs(trainer)) == 4
