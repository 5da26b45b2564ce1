"""The GPU check (bench/gpu_check.py) in its reduced CPU form, end to end, and the GPU study
config (config/gpu-study.yaml) as a Snakemake dry run."""

import json
import math
import os
import subprocess
import sys

import pytest
from mirrors import REPO

from istar.registry.precisions import run_precision

ENV_KEYS = {"python", "torch", "cuda", "transformers", "accelerate", "istar", "device"}


def run_check(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


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


@pytest.mark.parametrize("problem", ["missing", "not_rte"])
def test_bad_rte_data_gets_a_one_line_error(problem, tiny_model_dir, prepared, tmp_path):
    data = tmp_path / "nothing" if problem == "missing" else prepared("mrpc", 16, 8)
    done = run_check("--model", str(tiny_model_dir), "--rte-data", str(data), "--out", str(tmp_path / "r.json"))
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("gpu_check: error:") and "istar prepare-data --task rte" in message
    assert not (tmp_path / "r.json").exists()
