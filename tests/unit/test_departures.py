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


# -------------------------------------------------------------------- Σ_S of the analysis


def test_the_analysis_uses_the_fine_tuned_models_own_sigma_when_asked(tiny_model_dir, prepared, tmp_path):
    """fine_tuned: each run's analysis equals one against `istar shrinkage` of that run's model (the same
    rows and order as the pretrained Σ_S), and differs from the analysis against the pretrained Σ_S."""
    from istar.config.specs import MeasureSpec, ShrinkageSpec, TrainSpec
    from istar.registry.analysis import SIGMA_SOURCES
    from istar.steps.measure import measure_runs
    from istar.steps.shrinkage import compute_shrinkage_file
    from istar.steps.train import train

    data, run = prepared("rte", 48, 24), tmp_path / "run"
    train(TrainSpec(model=str(tiny_model_dir), data_dir=str(data), output_dir=str(run), method="base", epochs=1,
                    batch_size=16, learning_rate=1e-3))
    pretrained, fine_tuned = tmp_path / "sigma0.pt", tmp_path / "sigma_fine_tuned.pt"
    for model, out in ((tiny_model_dir, pretrained), (run / "model", fine_tuned)):
        compute_shrinkage_file(ShrinkageSpec(model=str(model), data_dir=str(data), out=str(out), rows=2000))

    def analysis(name, **sigma):
        spec = MeasureSpec(runs=[str(run)], data_dir=str(data), out=str(tmp_path / f"{name}.json"), shrinkage_rows=2000,
                           **sigma)
        return measure_runs(spec)["runs"][str(run)]["analysis"]

    own = analysis("own", sigma_s_model="fine_tuned")
    from_file = analysis("file", sigma_s=str(fine_tuned))
    from_pretrained = analysis("pretrained", sigma_s=str(pretrained))
    assert own["sigma_s"].startswith(f"the fine-tuned model of {run}")
    assert {**own, "sigma_s": None} == {**from_file, "sigma_s": None}
    assert own["global"]["isoscore_star"] != pytest.approx(from_pretrained["global"]["isoscore_star"], abs=1e-4)
    assert own["global"]["isoscore"] == from_pretrained["global"]["isoscore"]  # ζ = 0 reads no Σ_S
    assert set(SIGMA_SOURCES) == set(paper_schema_enum("analysis", "sigma_s_model"))


def paper_schema_enum(section: str, key: str) -> list:
    from istar.config.schema import load_schema

    return load_schema()["properties"][section]["properties"][key]["enum"]


def test_the_sigma_model_reaches_the_measure_spec():
    assert paper_config()["analysis"]["sigma_s_model"] == "fine_tuned"
    config = validate_config({"analysis": {"sigma_s_model": "fine_tuned"}}, check_paths=False)
    spec = measure_spec(config, runs=["r"], task="rte", data_dir="d", sigma_s="s.pt", out="m.json")
    assert (spec.sigma_s_model, spec.sigma_s, spec.shrinkage_rows) == ("fine_tuned", None, 250000)
    default = measure_spec(validate_config({}, check_paths=False), runs=["r"], task="rte", data_dir="d",
                           sigma_s="s.pt", out="m.json")
    assert (default.sigma_s_model, default.sigma_s) == ("pretrained", "s.pt")
    from istar.config.specs import MeasureSpec, SpecError

    with pytest.raises(SpecError, match="goes with --sigma-s-model pretrained"):
        MeasureSpec(runs=["r"], data_dir="d", out="m.json", sigma_s_model="fine_tuned", sigma_s="s.pt").validate()
