"""The shipped ``transformers.Trainer`` integration, trained for real: the packaged MiniLM on a few SST-2 rows of
tests/data (short sequences, a few optimizer steps, one process, CPU), and under accelerate with two gloo ranks."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import training_logs
from trainer_runs import MINILM, trainer_for

import istar
from istar.models.loading import resolve_model_source


def test_gradient_accumulation_and_bf16_scale_the_penalty_like_the_task_loss(tmp_path):
    """Two micro-batches per optimizer step under bf16 autocast: the logged loss (what the Trainer
    backpropagates, summed over the step) is still the micro-batch mean of task loss + penalty."""
    trainer = trainer_for(tmp_path, istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=2000), gradient_accumulation_steps=2,
                          per_device_train_batch_size=4, max_steps=2, bf16=True)
    trainer.train()
    logs = training_logs(trainer)
    assert len(logs) == 2
    for entry in logs:
        assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["istar_penalty"], abs=2e-3), entry
        assert entry["istar_penalty"] < 0


def test_training_batches_without_a_mask_are_named_before_the_sigma_pass(tmp_path):
    from transformers import AutoTokenizer, DataCollatorWithPadding

    trainer = trainer_for(tmp_path, istar.IStarConfig(lam=-1.0, zeta=0.2), max_steps=1)
    pad = DataCollatorWithPadding(AutoTokenizer.from_pretrained(resolve_model_source(MINILM)))
    trainer.data_collator = lambda rows: {k: v for k, v in pad(rows).items() if k != "attention_mask"}
    with pytest.raises(ValueError, match=r"^the training batches have no attention_mask \(keys: input_ids"):
        trainer.train()
    assert trainer.sigma_s is None and trainer.state.global_step == 0
    with pytest.raises(TypeError, match=r"istar=IStarConfig\(lam=..., zeta=...\)"):
        istar.IStarTrainer(model=trainer.model, args=trainer.args, istar={"lam": -1})


def test_a_model_without_hidden_states_is_named_in_the_first_sigma_batch(tmp_path):
    """A model configured with return_dict=False answers with a tuple: the Σ_S pass names the need for a ModelOutput."""
    trainer = trainer_for(tmp_path, istar.IStarConfig(lam=-1.0, zeta=0.2), max_steps=1)
    trainer.model.config.return_dict = False
    with pytest.raises(ValueError, match="returned no hidden_states although called with output_hidden_states=True"):
        trainer.train()
    assert trainer.sigma_s is None and trainer.state.global_step == 0


def test_cosreg_trains_through_the_config_and_logs_its_own_measure(tmp_path):
    """IStarConfig(method="cosreg"): the registry's CosReg penalty (λ = 1, its default) on the last layer, no Σ_S."""
    trainer = trainer_for(tmp_path, istar.IStarConfig(method="cosreg"), max_steps=2)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "cosine_similarity" in entry]
    assert len(logs) == 2 and trainer.sigma_s is None
    for entry in logs:
        assert 0 < entry["cosreg_penalty"] == pytest.approx(entry["cosine_similarity"], abs=2e-2)
        assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["cosreg_penalty"], abs=1e-4), entry


def test_a_sigma_of_another_hidden_size_is_refused_naming_both_shapes(tmp_path):
    trainer = trainer_for(tmp_path, istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(768)), max_steps=1)
    with pytest.raises(ValueError, match=r"sigma_s has shape \(768, 768\) but the model's hidden states have d = 384, "
                                         r"so Σ_S must be \(384, 384\)"):
        trainer.train()
    assert trainer.state.global_step == 0
