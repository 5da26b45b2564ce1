"""The integrations beyond IStarTrainer, trained for real on the packaged MiniLM: the sentence-transformers loss with
SentenceTransformerTrainer, TRL's SFTTrainer through the mixin, the model wrapper in a transformers.Trainer and in a plain
accelerate loop (the Lightning recipe of docs/library.md runs in tests/integration/test_docs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from integrations_helpers import SENTENCES
from mirrors import REPO
from services import free_port
from trainer_runs import MINILM, accuracy, sst2
from wrapper_step import step_split

import istar
from istar.models.loading import resolve_model_source


def late_isoscore(log_history, key="isoscore_star") -> float:
    values = [entry[key] for entry in log_history if key in entry]
    assert len(values) >= 4, log_history
    return float(np.mean(values[-2:]))


# ----------------------------------------------------------------------------- sentence-transformers


def st_run(tmp_path, lam: float):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses

    torch.manual_seed(0)
    model = SentenceTransformer(resolve_model_source(MINILM), device="cpu")
    train = Dataset.from_dict({"anchor": SENTENCES, "positive": [s.split(",")[0][::-1] for s in SENTENCES]})
    loss = istar.IStarLoss(model, losses.MultipleNegativesRankingLoss(model),
                           istar.IStarConfig(lam=lam, zeta=0.2, shrinkage_rows=1000), sigma_data=train["anchor"])
    args = SentenceTransformerTrainingArguments(str(tmp_path), per_device_train_batch_size=4, num_train_epochs=2,
                                                learning_rate=5e-4, logging_steps=1, report_to=[], save_strategy="no",
                                                use_cpu=True, disable_tqdm=True, seed=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                                         callbacks=[istar.IStarCallback(loss)])
    trainer.train()
    return trainer


# two SentenceTransformerTrainer runs of 4 steps, a Σ_S pass at each epoch's start
def test_the_sentence_transformers_loss_moves_isoscore_star_the_way_lambda_says(tmp_path):
    runs = {lam: st_run(tmp_path / str(lam), lam) for lam in (-1.0, 1.0)}
    for trainer in runs.values():
        logs = [entry for entry in trainer.state.log_history if "isoscore_star" in entry]
        assert len(logs) == 4 and [e["step"] for e in trainer.state.log_history if "sigma_s_isoscore" in e] == [1, 3]
        for entry in logs:  # the trainer's loss is the wrapped loss plus the penalty, logged apart
            assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["istar_penalty"], abs=2e-3), entry
    first = [trainer.state.log_history[0]["isoscore_star"] for trainer in runs.values()]
    assert first[0] == pytest.approx(first[1], abs=1e-6)  # the same model and batch at step 1
    late = {lam: late_isoscore(trainer.state.log_history) for lam, trainer in runs.items()}
    assert late[-1.0] < late[1.0], late  # from the same start, on the same batches: λ's sign alone differs


# ----------------------------------------------------------------------------- TRL's SFTTrainer


def sft_run(tmp_path, lam: float, **arguments):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    class IStarSFTTrainer(istar.IStarTrainerMixin, SFTTrainer):
        pass

    source = resolve_model_source(MINILM)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.eos_token = tokenizer.sep_token  # a BERT tokenizer names no end-of-sequence token
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(source, is_decoder=True)  # MiniLM as a small causal LM
    settings = dict(per_device_train_batch_size=4, num_train_epochs=2, learning_rate=5e-4, logging_steps=1,
                    report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, max_length=32)
    trainer = IStarSFTTrainer(model=model, args=SFTConfig(str(tmp_path), **{**settings, **arguments}),
                              train_dataset=Dataset.from_dict({"text": SENTENCES}), processing_class=tokenizer,
                              istar=istar.IStarConfig(lam=lam, zeta=0.2, shrinkage_rows=1000))
    trainer.train()
    return trainer


# two SFTTrainer runs of 4 steps, a Σ_S pass at each epoch's start
def test_sft_trainer_through_the_mixin_moves_isoscore_star_the_way_lambda_says(tmp_path):
    """TRL computes its loss from a fused LM head and rebuilds the outputs without gradients; the mixin reads the
    hidden states from the backbone's forward, so the penalty's gradient reaches the model."""
    runs = {lam: sft_run(tmp_path / str(lam), lam) for lam in (-1.0, 1.0)}
    for trainer in runs.values():
        logs = [entry for entry in trainer.state.log_history if "isoscore_star" in entry]
        assert len(logs) == 4 and "mean_token_accuracy" in logs[0]  # TRL's own logs are kept
        for entry in logs:
            assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["istar_penalty"], abs=2e-3), entry
    first = [trainer.state.log_history[1]["isoscore_star"] for trainer in runs.values()]
    assert first[0] == pytest.approx(first[1], abs=1e-6)  # the same model and batch at step 1
    late = {lam: late_isoscore(trainer.state.log_history) for lam, trainer in runs.items()}
    assert late[-1.0] < late[1.0], late


# ----------------------------------------------------------------------------- the model wrapper


def wrapped_trainer(tmp_path, config, wrap: bool = True, **arguments):
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer
    from transformers import TrainingArguments

    source = resolve_model_source(MINILM)
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
    train, collator = sst2("train", 16, tokenizer), DataCollatorWithPadding(tokenizer)
    callbacks = []
    if wrap:
        sigma_loader = DataLoader(train.remove_columns("labels"), batch_size=16, collate_fn=collator)
        model = istar.IStarModel(model, config, sigma_data=sigma_loader)
        callbacks = [istar.IStarCallback()]
    settings = dict(per_device_train_batch_size=8, per_device_eval_batch_size=8, num_train_epochs=2, learning_rate=1e-4,
                    logging_steps=1, seed=0, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    return Trainer(model=model, args=TrainingArguments(str(tmp_path), **{**settings, **arguments}), train_dataset=train,
                   eval_dataset=sst2("dev", 8, tokenizer), data_collator=collator, compute_metrics=accuracy,
                   callbacks=callbacks)


# three Trainer runs of 4 steps, a Σ_S pass at each epoch's start of two
def test_the_wrapper_in_a_plain_trainer_penalises_logs_and_leaves_evaluation_alone(tmp_path):
    """A plain Trainer with the wrapped model: the penalty in the loss and the logs, Σ_S at each epoch, evaluate() with
    compute_metrics as without I-STAR; at λ = 0 the parameters are the plain Trainer's, bit for bit."""
    trainer = wrapped_trainer(tmp_path / "lower", istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=1000))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "isoscore_star" in entry]
    assert len(logs) == 4 and [e["step"] for e in logs if "sigma_s_isoscore" in e] == [1, 3]
    for entry in logs:
        assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["istar_penalty"], abs=1e-4), entry
    assert trainer.model.sigma_epoch == 1 and trainer.model.sigma_s.shape == (384, 384)
    result = trainer.evaluate()
    assert 0.0 <= result["eval_accuracy"] <= 1.0 and np.isfinite(result["eval_loss"])

    parameters = {}
    for name, wrap in (("plain", False), ("zero", True)):
        run = wrapped_trainer(tmp_path / name, istar.IStarConfig(lam=0.0, zeta=0.2, shrinkage_rows=1000), wrap=wrap)
        run.train()
        parameters[name] = {key: value.detach().clone() for key, value in run.model.named_parameters()}
    assert [key for key in parameters["plain"] if not torch.equal(parameters["plain"][key], parameters["zero"][key])] == []


# 4 steps and two Σ_S passes: about 20 s on a loaded 2-core machine
def test_the_wrapper_in_a_plain_accelerate_loop(tmp_path):
    """The recipe of docs/library.md for accelerate: prepare the wrapped model, refresh Σ_S at each epoch's start,
    backpropagate outputs.loss; the logs carry the penalty, and evaluation mode is the model's own forward."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    source = resolve_model_source(MINILM)
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
    data, collator = sst2("train", 8, tokenizer), DataCollatorWithPadding(tokenizer)
    accelerator = Accelerator(cpu=True)
    model = istar.IStarModel(model, istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=500),
                             sigma_data=DataLoader(data.remove_columns("labels"), batch_size=8, collate_fn=collator))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=collator)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    logs, scores = [], []
    for epoch in range(2):
        scores.append(accelerator.unwrap_model(model).refresh_sigma(epoch, accelerator, progress=False))
        model.train()
        for batch in loader:
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            logs.append(accelerator.unwrap_model(model).pop_logs(accelerator))
    assert len(logs) == 4 and all(0 < entry["isoscore_star"] < 1 and entry["istar_penalty"] < 0 for entry in logs)
    assert all(0 < score < 1 for score in scores) and scores[0] != scores[1]
    model.eval()
    with torch.no_grad():
        outputs = model(**next(iter(loader)))
    assert outputs.hidden_states is None and model.pop_logs() == {}


@pytest.mark.parametrize("kind", ["classifier", "causal_lm"])
def test_one_micro_batch_per_step_weighs_task_and_penalty_alike(tmp_path, kind):
    split = step_split(tmp_path, kind, accumulation=1)
    assert split["task"] == pytest.approx(1.0, abs=1e-5) and split["penalty"] == pytest.approx(1.0, abs=1e-5), split


# torchrun, two gloo ranks, four Trainers of one step on width-16 models
def test_two_processes_weigh_task_and_penalty_alike(tmp_path):
    """Two gloo ranks × two micro-batches: the all-reduced gradient is the mean over both ranks' micro-batches of the
    task loss's gradient plus the penalty's (λ is not divided by the number of processes), and both ranks log one
    IsoScore*."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()),
                             str(REPO / "tests" / "support" / "wrapper_step.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for kind in ("classifier", "causal_lm"):  # each rank logs the mean over both ranks' micro-batches
        assert ranks[0][kind]["isoscore_star"] == ranks[1][kind]["isoscore_star"], (kind, ranks)
    for rank, found in enumerate(ranks):
        assert found["world_size"] == 2
        for kind in ("classifier", "causal_lm"):
            split = found[kind]
            assert split["task"] == pytest.approx(1.0, abs=1e-5), (rank, kind, split)
            assert split["penalty"] == pytest.approx(1.0, abs=1e-5), (rank, kind, split)



# ----------------------------------------------------------------------------- the wrapper saved and loaded by a Trainer


def tiny_head(head: str):
    """A width-16 BERT (random weights, no dropout) with a sequence classifier or a masked LM head (tied weights)."""
    from transformers import BertForMaskedLM
    from wrapper_step import tiny_model

    classifier = tiny_model("classifier")
    if head == "classifier":
        return classifier
    torch.manual_seed(0)
    return BertForMaskedLM(classifier.config)


def saved_run(folder: Path, model, lm: bool, resume: Path | None = None, **arguments):
    """Two steps of a plain Trainer on the wrapped ``model`` (a fixed Σ_S), a checkpoint after each, then ``save_model``
    to ``folder/final``; the trainer and a batch to compare outputs on."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    config = istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(16), recompute_shrinkage=False)
    lines = [[1, 5 + index, 7 + index % 3, 2] for index in range(8)]
    data = Dataset.from_list([{"input_ids": ids, "attention_mask": [1] * 4, "labels": ids if lm else index % 2}
                              for index, ids in enumerate(lines)])
    args = TrainingArguments(str(folder), per_device_train_batch_size=4, num_train_epochs=1, learning_rate=1e-2,
                             logging_steps=1, save_steps=1, use_cpu=True, disable_tqdm=True, seed=0,
                             **{"report_to": [], **arguments})
    trainer = Trainer(model=istar.IStarModel(model, config), args=args, train_dataset=data,
                      callbacks=[istar.IStarCallback()])
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    trainer.save_model(str(folder / "final"))
    return trainer, {"input_ids": torch.tensor(lines[:3]), "attention_mask": torch.ones(3, 4, dtype=torch.long)}


def largest_difference(loaded, wrapped, batch) -> float:
    """max |logits of ``loaded`` − logits of ``wrapped``| on ``batch``, both in evaluation mode."""
    with torch.no_grad():
        return float((loaded.eval()(**batch).logits - wrapped.eval()(**batch).logits).abs().max())


# three Trainer runs of two steps each on width-16 BERTs: a few seconds
@pytest.mark.parametrize("head", ["classifier", "masked_lm"])
def test_a_trainers_checkpoints_and_saved_model_load_as_the_wrapped_model(tmp_path, head):
    """Each checkpoint and the save_model folder hold config.json, the model's own keys (a masked LM's tied weights once,
    still tied when loaded) and istar_config.json; from_pretrained gives the wrapped model's outputs, and a run resumed
    from the first checkpoint ends on the uninterrupted run's parameters."""
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    lm = head == "masked_lm"
    trainer, batch = saved_run(tmp_path / "run", tiny_head(head), lm)
    for folder in ("checkpoint-1", "checkpoint-2", "final"):
        keys = load_file(tmp_path / "run" / folder / "model.safetensors")
        assert keys and not any(key.startswith("model.") for key in keys), list(keys)[:3]
        assert not lm or "cls.predictions.decoder.weight" not in keys  # the tied copy is not written
        settings = json.loads((tmp_path / "run" / folder / "istar_config.json").read_text())
        assert settings["istar"]["lam"] == -1.0 and settings["istar"]["zeta"] == 0.2
        assert settings["sigma_s"] == {"from": "a tensor given", "epoch": 0, "shape": [16, 16]}
    auto = AutoModelForMaskedLM if lm else AutoModelForSequenceClassification
    loaded = auto.from_pretrained(tmp_path / "run" / "final")
    assert type(loaded) is type(trainer.model).__bases__[1] and loaded.config.architectures == [type(loaded).__name__]
    assert largest_difference(loaded, trainer.model, batch) == 0.0
    assert largest_difference(auto.from_pretrained(tmp_path / "run" / "checkpoint-2"), trainer.model, batch) == 0.0
    assert largest_difference(auto.from_pretrained(tmp_path / "run" / "checkpoint-1"), trainer.model, batch) > 0
    if lm:
        assert loaded.cls.predictions.decoder.weight.data_ptr() == loaded.bert.embeddings.word_embeddings.weight.data_ptr()

    resumed, _ = saved_run(tmp_path / "resumed", tiny_head(head), lm, resume=tmp_path / "run" / "checkpoint-1")
    assert resumed.state.global_step == 2 and largest_difference(resumed.model, trainer.model, batch) == 0.0


# two Trainer steps of a width-16 BERT with LoRA: a few seconds
def test_a_trainers_saved_lora_model_is_an_adapter_folder_that_peft_loads(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    lora = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"])
    trainer, batch = saved_run(tmp_path, get_peft_model(tiny_head("classifier"), lora), lm=False)
    for folder in (tmp_path / "checkpoint-2", tmp_path / "final"):
        written = {path.name for path in folder.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "istar_config.json"} <= written, written
        loaded = PeftModel.from_pretrained(tiny_head("classifier"), folder)
        assert largest_difference(loaded, trainer.model, batch) == 0.0
    assert largest_difference(tiny_head("classifier"), trainer.model, batch) > 0  # the adapter changed the outputs


# two Trainer steps of a width-16 BERT, TensorBoard's event file read back
def test_the_wrappers_numbers_reach_a_report_to_tracker(tmp_path):
    """With report_to=["tensorboard"] (a tracker the Trainer lists before the callbacks it is given), TensorBoard holds
    the wrapper's task_loss, istar_penalty, isoscore_star and sigma_s_isoscore at the steps log_history has them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, _ = saved_run(tmp_path, tiny_head("classifier"), lm=False, report_to=["tensorboard"])
    (events,) = {path.parent for path in tmp_path.glob("runs/**/events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    for key in ("task_loss", "istar_penalty", "isoscore_star", "sigma_s_isoscore"):
        logged = {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry}
        written = {event.step: event.value for event in accumulator.Scalars(f"train/{key}")}
        assert logged and written == pytest.approx(logged, abs=1e-6), (key, written, logged)


# ----------------------------------------------------------------------------- Lightning


# two Lightning epochs of two steps on a width-16 BERT: a few seconds
def test_the_lightning_callback_refreshes_sigma_and_logs_the_penalty_to_the_logger(tmp_path):
    """IStarLightningCallback() finds the IStarModel the LightningModule holds, computes Σ_S at each epoch's start and
    logs the penalty's means after each batch to the module's logger (a CSV file here), the values the wrapper took."""
    import lightning
    import pandas
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader
    from wrapper_step import collate, rows

    from istar.integrations.lightning import IStarLightningCallback

    class Module(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.seen = []

        def training_step(self, batch, batch_index):
            outputs = self.model(**batch)
            self.seen.append(float(outputs.loss.detach()))
            return outputs.loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    data = rows("classifier", 8)
    wrapped = istar.IStarModel(tiny_head("classifier"), istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=200),
                               sigma_data=DataLoader(data, batch_size=4, collate_fn=collate))
    module = Module(wrapped)
    lightning.Trainer(max_epochs=2, accelerator="cpu", logger=CSVLogger(tmp_path), enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                      callbacks=[IStarLightningCallback()]).fit(module, DataLoader(data, batch_size=4, collate_fn=collate))
    assert wrapped.sigma_epoch == 1 and wrapped.sigma_s.shape == (16, 16)
    (metrics,) = tmp_path.glob("**/metrics.csv")
    logged = pandas.read_csv(metrics)
    steps = logged.dropna(subset=["isoscore_star"])
    assert len(steps) == 4 and ((0 < steps["isoscore_star"]) & (steps["isoscore_star"] < 1)).all()
    assert (steps["task_loss"] + steps["istar_penalty"]).tolist() == pytest.approx(module.seen, abs=1e-5)
    assert logged["sigma_s_isoscore"].notna().sum() == 2
    with pytest.raises(TypeError, match=r"^IStarLightningCallback\(\) found 0 IStarModel in Module, not one"):
        IStarLightningCallback().on_train_epoch_start(None, Module(tiny_head("classifier")))
