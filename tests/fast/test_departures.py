"""The departures from the authors' code that are settings (docs/method.md §7): each one changes
what it claims to change, and config/paper.yaml (config/anisotropy.yaml) sets the authors' value."""


import pytest
import torch
import yaml
from mirrors import REPO

from istar.config.specs import ModelData
from istar.pipeline.plan import measure_spec, shrinkage_spec, train_spec
from istar.pipeline.validate import load_config, validate_config


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
    from istar.steps.common import open_model_context

    context = open_model_context(ModelData(model=str(model_dir), data_dir=str(data), segment_ids=segment_ids,
                                           **lengths), model_seed=0)
    features = context.features("train")
    return context, features, next(iter(context.loader(features, size)))


def test_without_segment_ids_a_pair_task_gets_the_authors_batch_and_the_model_reads_segment_0(tiny_model_dir, prepared):
    data = prepared("rte", 16, 8)
    context, features, ours = first_batch(tiny_model_dir, data, segment_ids=False)
    _, _, with_segments = first_batch(tiny_model_dir, data, segment_ids=True)
    theirs = authors_collate([features[i] for i in range(8)])
    assert set(ours) == set(theirs) == {"input_ids", "attention_mask", "labels"}
    for key in theirs:
        assert torch.equal(ours[key], theirs[key].to(ours[key].dtype)), key
    # the same pairs, the tokenizer's segment ids: 1 over each second sentence
    assert torch.equal(with_segments["input_ids"], ours["input_ids"]) and with_segments["token_type_ids"].any()
    model = context.model.eval()
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


@pytest.mark.parametrize("path, keys", [("paper.yaml", ("segment_ids:", "sigma_s_model:", "sst5:")),
                                        ("anisotropy.yaml", ("dtype:", "crystalcoder:"))])
def test_the_authors_configs_name_the_evidence_of_each_departure(path, keys):
    """Each departure's value in config/paper.yaml and config/anisotropy.yaml carries a comment naming the
    authors' file and line."""
    import re

    lines = (REPO / "config" / path).read_text().splitlines()
    for key in keys:
        line = next(line for line in lines if line.strip().startswith(key))
        assert re.search(r"\w+\.py:\d+", line), line
    assert yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["training"]["segment_ids"] is False


# -------------------------------------------------------------------- Σ_S of the analysis


def test_the_analysis_uses_the_fine_tuned_models_own_sigma_when_asked(tiny_model_dir, prepared, tmp_path,
                                                                      monkeypatch):
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
    with monkeypatch.context() as patch:
        # the file is the run's own model's Σ_S given as the pretrained one, which measure_runs
        # rightly refuses (check_inputs: another model's Σ_S); here it is the reference to compare with
        patch.setattr("istar.steps.measure.check_inputs", lambda *args: None)
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


# ------------------------------------------------------------------ the survey (NAACL 2024)


REMOTE_CONFIG = '''from transformers import GPTNeoXConfig


class TinyRemoteConfig(GPTNeoXConfig):
    model_type = "tiny_remote"
'''
REMOTE_MODEL = '''from transformers import GPTNeoXForCausalLM

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForCausalLM(GPTNeoXForCausalLM):
    config_class = TinyRemoteConfig
'''


@pytest.fixture
def remote_code_model(tmp_path, monkeypatch):
    """A tiny causal LM whose folder ships its own model code (auto_map), as LLM360/CrystalCoder's repo does."""
    import json

    import transformers.dynamic_module_utils as modules
    from hub_repos import tiny_model_files

    monkeypatch.setattr(modules, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # the copied code stays here
    folder = tmp_path / "tiny-remote"
    tiny_model_files("gpt_neox", folder)
    (folder / "configuration_tiny_remote.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny_remote.py").write_text(REMOTE_MODEL)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_remote", architectures=["TinyRemoteForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                            "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_model_with_its_own_code_needs_trust_remote_code(remote_code_model, tmp_path):
    from istar.config.specs import SurveySpec
    from istar.steps.survey import survey_model

    text = tmp_path / "text.txt"
    text.write_text("A short line of text for the profile.\nAnother line, a little longer than the first one.\n" * 20)
    spec = dict(model=str(remote_code_model), text=str(text), out=str(tmp_path / "p.json"), tokens=40, sigma_tokens=40,
                twonn_tokens=0, device="cpu", max_length=16)
    with pytest.raises(ValueError, match="set trust_remote_code: true for it under survey.models"):
        survey_model(SurveySpec(**spec))
    profile = survey_model(SurveySpec(**spec, trust_remote_code=True))
    assert profile["provenance"]["architecture"] == "TinyRemoteForCausalLM"
    assert profile["provenance"]["trust_remote_code"] is True and set(profile["static"]) == {"input", "output"}


def test_survey_settings_reach_the_spec_and_the_naacl_config_uses_the_authors_values():
    from istar.pipeline.plan import survey_spec

    naacl = load_config(REPO / "config" / "anisotropy.yaml", check_paths=False)
    assert naacl["survey"]["dtype"] == "float32"  # partition_function.py loads with from_pretrained's default
    assert naacl["survey"]["models"]["crystalcoder"]["trust_remote_code"] is True
    assert naacl["survey"]["models"]["pythia-70m"]["trust_remote_code"] is False  # the schema's default, filled in
    spec = survey_spec(naacl, model="crystalcoder", revision="as-given", text="t", out="o.json")
    assert spec.trust_remote_code is True and spec.dtype == "float32"


def test_a_tied_decoders_single_matrix_is_its_output_matrix():
    """OPT and Falcon share one matrix between input and output; Machina & Mercer's code reports it as
    emb_out (partition_function.py, falcon_get_embeddings and opt_get_embeddings), and so does the survey."""
    from transformers import OPTConfig, OPTForCausalLM

    from istar.models.pretrained import LoadedModel

    torch.manual_seed(0)
    model = OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                     num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=32))
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert outputs.data_ptr() == inputs.data_ptr()  # tied: one matrix
    common = dict(model=model, backbone=model.model, tokenizer=None, device=torch.device("cpu"), final_norm=None,
                  final_norm_name=None, num_layers=1, hidden_size=16, provenance={})
    tied = LoadedModel(**common, input_embeddings=inputs, output_embeddings=None, has_output_matrix=True)
    assert list(tied.static_matrices) == ["output"] and tied.static_matrices["output"] is inputs
    encoder = LoadedModel(**common, input_embeddings=inputs, output_embeddings=None, has_output_matrix=False)
    assert list(encoder.static_matrices) == ["input"]


# ------------------------------------------------------------------------------ SST-5's source


def test_the_hub_dataset_choice_is_the_registrys_and_reaches_prepare_data():
    from istar.data.hub import HUB_SOURCES
    from istar.pipeline.plan import prepare_data_spec

    from istar.config.schema import load_schema

    entries = load_schema()["properties"]["data"]["properties"]["hub_datasets"]["properties"]
    assert {task: entry["enum"] for task, entry in entries.items()} == {
        task: [source.hub_id for source in sources] for task, sources in HUB_SOURCES.items() if len(sources) > 1}
    assert all(entry["default"] == HUB_SOURCES[task][0].hub_id for task, entry in entries.items())
    paper = paper_config()
    assert paper["data"]["hub_datasets"]["sst5"] == "stanfordnlp/sst"
    assert prepare_data_spec(paper, task="sst5", out="o").hub_dataset == "stanfordnlp/sst"
    assert prepare_data_spec(validate_config({}, check_paths=False), task="sst5", out="o").hub_dataset == "SetFit/sst5"
