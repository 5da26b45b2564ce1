"""The GPU check (bench/gpu_check.py) in its reduced CPU form, end to end, and the GPU study
config (config/gpu-study.yaml) as a Snakemake dry run."""

import json
import math
import os
import subprocess
import sys

import pytest
import yaml
from mirrors import REPO

from bench.gpu_check import steps_taken
from istar.registry.precisions import run_precision

ENV_KEYS = {"python", "torch", "cuda", "transformers", "accelerate", "istar", "device"}


def run_check(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.integration
def test_cpu_form_runs_every_section_and_writes_sane_json(tiny_model_dir, prepared, tmp_path):
    out = tmp_path / "results.json"
    done = run_check("--model", str(tiny_model_dir), "--rte-data", str(prepared("rte", 24, 8)), "--out", str(out),
                     "--cpu-smoke", "--workdir", str(tmp_path / "work"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "cpu-smoke" and results["failures"] == []
    assert ENV_KEYS <= set(results["environment"])
    sections = results["sections"]
    assert not [name for name, section in sections.items() if "error" in section]

    rows = sections["isoscore_star"]["rows"]
    assert {(r["n"], r["d"], r["precision"]) for r in rows} == {
        (n, d, p) for n, d in ((1024, 64), (512, 32)) for p in ("fp32", "bf16 autocast")}
    for row in rows:
        assert set(row["ms"]) == {"closed form", "closed form, plain autograd", "eigh", "svd", "floor XᵀX"}
        assert all(finite(v) and v > 0 for v in [*row["ms"].values(), *row["ratio_to_floor"].values()])
        assert finite(row["svd_over_closed_form"]) and finite(row["closed_form_over_floor"])
        assert all(0 <= v <= 1 for v in row["scores"].values())
        if row["precision"] == "fp32":  # every route computes the same score
            assert max(row["scores"].values()) - min(row["scores"].values()) < 1e-5

    steps = sections["train_step"]["rows"]
    assert [r["encoder"] for r in steps] == ["2-layer d = 64 config, random weights", str(tiny_model_dir)]
    for row in steps:
        assert set(row["methods"]) == {"base", "cosreg", "istar"}
        assert finite(row["istar_over_base"]) and finite(row["cosreg_over_base"])
        for values in row["methods"].values():
            assert finite(values["median_s"]) and values["median_s"] > 0
            assert len(values["losses"]) == values["steps"] and all(map(finite, values["losses"]))
            assert values["peak_memory_mb"] is None and values["skipped_steps"] == 0  # no GPU, no scaler

    shrinkage = sections["shrinkage"]
    assert shrinkage["rows"] >= shrinkage["requested_rows"] == 1000 and shrinkage["hidden_size"] == 32
    assert finite(shrinkage["accumulation_seconds"]) and shrinkage["peak_gpu_memory_mb"] is None

    launch = sections["launch"]
    assert launch["command"][1:6] == ["-m", "istar", "launch", "--gpus", "0"]
    assert launch["precision"]["effective"] == launch["expected_precision"] == run_precision("fp16", "cpu").label
    assert launch["losses_finite"] and finite(launch["final_loss"]) and 0 <= launch["score"] <= 1
    # 24 examples / 8 = 3 batches, accumulated 2 by 2 (the study's recipe); under its constant
    # learning rate the log cannot tell an applied step from a skipped one
    assert launch["optimizer_steps"] == launch["logged_steps"] == 2 and launch["steps_taken"] is None
    assert (tmp_path / "work" / "run" / "model" / "config.json").is_file()
    assert set(results["targets"]) == {"svd_over_closed_form", "closed_form_over_floor", "istar_over_base"}


def test_steps_taken_counts_learning_rate_moves():
    # linear decay from 1e-4 over 4 steps, the scaler skipping the first and third attempt
    assert steps_taken([1e-4, 7.5e-5, 7.5e-5, 5e-5, 2.5e-5, 0.0], initial_lr=1e-4) == 4
    assert steps_taken([1e-4, 1e-4], initial_lr=1e-4) == 0


@pytest.mark.parametrize("problem", ["missing", "not_rte"])
@pytest.mark.integration
def test_bad_rte_data_gets_a_one_line_error(problem, tiny_model_dir, prepared, tmp_path):
    data = tmp_path / "nothing" if problem == "missing" else prepared("mrpc", 16, 8)
    done = run_check("--model", str(tiny_model_dir), "--rte-data", str(data), "--out", str(tmp_path / "r.json"))
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("gpu_check: error:") and "istar prepare-data --task rte" in message
    assert not (tmp_path / "r.json").exists()


GPU_STUDY_JOBS = {
    # per task (SST-2, MRPC): λ | ζ fixed in advance, so no search; Σ_S over real tokens (for the
    # measurements) and over all positions (the penalty's); Base and I-STAR over 10 seeds, one
    # measure job per setting
    "prepare_data": 2, "pin_model": 1, "shrinkage": 2, "shrinkage_all_positions": 2, "select": 2,
    "train": 2 * 2 * 10, "measure": 2 * 2,
    "run_config": 1, "aggregate": 1, "experiment": 1, "table": 4, "figure": 2, "summary": 1, "report": 1, "all": 1,  # Tables 1, 2, claims, seeds; Σ_S across epochs, the forest plot
}


@pytest.mark.e2e
def test_gpu_study_config_dry_run(tmp_path):
    from mirrors import TEST_DATA
    from workflow_helpers import planned_jobs, snakemake

    config = yaml.safe_load((REPO / "config" / "gpu-study.yaml").read_text())
    assert config["training"]["gpus"] == 1 and config["training"]["mixed_precision"] == "fp16"
    config["data"].update(source="mirror", mirror=str(TEST_DATA), subset=True)  # offline: a dry run only asks that the files exist
    configfile = tmp_path / "gpu-study.yaml"
    configfile.write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n", "--resources", "gpu=1", configfile=configfile)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == GPU_STUDY_JOBS
    # every fine-tune is launched on one GPU in fp16
    assert result.stdout.count("--gpus 1 --mixed-precision fp16 -- train") == 40
