"""The departures from the authors' code that are settings (docs/method.md §7): each one changes
what it claims to change, and config/paper.yaml (config/anisotropy.yaml) sets the authors' value."""

from pathlib import Path

import pytest
import torch
import yaml

from istar.config.specs import ModelData
from istar.pipeline.plan import measure_spec, shrinkage_spec, train_spec
from istar.pipeline.validate import load_config, validate_config

REPO = Path(__file__).resolve().parents[2]


def paper_config() -> dict:
    return load_config(REPO / "config" / "paper.yaml", check_paths=False)


# ------------------------------------------------------------------------------ segment ids


def authors_collate(features: list[dict]) -> dict:
    """The batch the authors' classification collate makes (I-STAR/training_utils.py,
    classification_collate_fn): input ids padded with 0 to the longest, a float mask, the labels;
    nothing else."""
    longest = max(len(f["input_ids"]) for f in features)
    return {"input_ids": torch.tensor([f["input_ids"] + [0] * (longest - len(f["input_ids"])) for f in features]),
            "attention_mask": torch.tensor([[1.0] * len(f["input_ids"]) + [0.0] * (longest - len(f["input_ids"]))
                                            for f in features]),
            "labels": torch.tensor([f["labels"] for f in features])}


def first_batch(model_dir, data, segment_ids: bool, size: int = 8, **lengths):
    from istar.steps.common import open_step

    step = open_step(ModelData(model=str(model_dir), data_dir=str(data), segment_ids=segment_ids, **lengths),
                     model_seed=0)
    features = step.features("train")
    return step, features, next(iter(step.loader(features, size)))


def test_without_segment_ids_a_pair_task_gets_the_authors_batch_and_the_model_reads_segment_0(tiny_model_dir, prepared):
    data = prepared("rte", 16, 8)
    step, features, ours = first_batch(tiny_model_dir, data, segment_ids=False)
    _, _, with_segments = first_batch(tiny_model_dir, data, segment_ids=True)
    theirs = authors_collate([features[i] for i in range(8)])
    assert set(ours) == set(theirs) == {"input_ids", "attention_mask", "labels"}
    for key in theirs:
        assert torch.equal(ours[key], theirs[key].to(ours[key].dtype)), key
    # the same pairs, the tokenizer's segment ids: 1 over each second sentence
    assert torch.equal(with_segments["input_ids"], ours["input_ids"]) and with_segments["token_type_ids"].any()
    model = step.model.eval()
    with torch.no_grad():
        left_out = model(**ours).logits
        zeros = model(**ours, token_type_ids=torch.zeros_like(ours["input_ids"])).logits
        real = model(**with_segments).logits
    assert torch.equal(left_out, zeros)
    assert not torch.allclose(left_out, real)


def test_a_single_sentence_task_and_squad_are_left_as_they_are(tiny_model_dir, prepared):
    for task, lengths in (("sst2", {}), ("squad", {"max_length": 384, "doc_stride": 128})):
        _, _, off = first_batch(tiny_model_dir, prepared(task, 16, 8), segment_ids=False, **lengths)
        _, _, on = first_batch(tiny_model_dir, prepared(task, 16, 8), segment_ids=True, **lengths)
        if task == "sst2":  # one sentence: segment 0 everywhere either way
            assert "token_type_ids" not in off and not on["token_type_ids"].any()
        else:  # the authors' QA loader (default_data_collator) keeps them
            assert torch.equal(off["token_type_ids"], on["token_type_ids"]) and on["token_type_ids"].any()


def test_segment_ids_reach_every_model_step_from_the_config():
    from istar.config.layout import Setting

    assert paper_config()["training"]["segment_ids"] is False
    config = validate_config({"training": {"segment_ids": False}}, check_paths=False)
    assert validate_config({}, check_paths=False)["training"]["segment_ids"] is True
    common = dict(model="m", task="rte", data_dir="d")
    assert train_spec(config, **common, setting=Setting("base"), seed=0, output_dir="o", sigma_s=None).segment_ids is False
    assert shrinkage_spec(config, **common, out="s.pt").segment_ids is False
    spec = measure_spec(config, runs=["r"], task="rte", data_dir="d", sigma_s="s.pt", out="m.json")
    assert spec.segment_ids is False and spec.model_data("r").segment_ids is False


def test_the_paper_config_names_its_evidence_for_each_departure():
    """Every departure key in config/paper.yaml carries a comment naming the authors' file."""
    text = (REPO / "config" / "paper.yaml").read_text()
    for key in ("segment_ids:",):
        line = next(line for line in text.splitlines() if line.strip().startswith(key))
        assert ".py" in line, line
    assert yaml.safe_load(text)["training"]["segment_ids"] is False
