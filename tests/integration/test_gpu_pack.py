"""bench/gpu_pack.py (issue 46's GPU measurements in one command) in its quick CPU form, end to end: the closed
form's product against the floor and float64, the packing sweep's worker processes, eager against captured
steps; the JSON's structure and every ratio finite. Its numbers say nothing about a GPU."""

import json
import math
import os
import subprocess
import sys

from mirrors import REPO


def test_quick_form_runs_every_section_and_writes_finite_ratios(tmp_path):
    out = tmp_path / "gpu_pack.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_pack", "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=540,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["form"] == "quick" and results["failures"] == []
    sections = results["sections"]
    assert set(sections) == {"product", "packing", "capture"}
    assert all("error" not in section and section["seconds"] > 0 for section in sections.values())

    product = sections["product"]
    assert all(math.isfinite(r["closed_form_over_floor"]) and math.isfinite(r["before_over_floor"])
               for r in product["timings"])
    for row in product["accuracy"]:  # the reduced product stays near float64 (bounds: tests/fast/core/test_isotropy.py)
        assert row["score_error"] < 2e-4 and row["gradient_relative_error"] < 2e-2, row

    packing = sections["packing"]["rows"]
    encoders = {r["encoder"] for r in packing}
    assert len(encoders) == 2 and {(r["encoder"], r["jobs"]) for r in packing} == {(e, k) for e in encoders for k in (1, 2)}
    assert all(r["finite"] and r["steps_per_s"] > 0 and math.isfinite(r["throughput_over_one"]) for r in packing)
    assert all(len(r["steps"]) == r["jobs"] and min(r["steps"]) >= 1 for r in packing)

    capture = sections["capture"]
    assert "training.compile = reduce-overhead" in capture["refused_on_this_device"]  # CUDA graphs: not on a CPU
    rows = capture["rows"]
    assert {(r["encoder"], r["method"]) for r in rows} == {(e, m) for e in encoders for m in ("base", "cosreg", "istar")}
    for row in rows:
        assert "skipped" not in row and row["finite"], row
        assert math.isfinite(row["captured_over_eager"]) and all(map(math.isfinite, row["over_base"].values()))
        assert row["largest_relative_loss_difference"] < 1e-3  # the same arithmetic, captured or not

    summary = results["summary"]
    assert set(summary["istar_over_base"]) == encoders and summary["peak_fp16_tflops"] is None
    assert all(share["flop_per_step"] > 0 for share in summary["base_share_of_peak"].values())


def test_a_command_cut_inside_a_section_keeps_the_rows_it_measured(tmp_path):
    """Killed (SIGKILL, as a time limit does) once the packing section's first row is measured: the JSON holds
    that row, marked partial."""
    import time

    out = tmp_path / "gpu_pack.json"
    process = subprocess.Popen([sys.executable, "-m", "bench.gpu_pack", "--quick", "--sections", "packing", "--out",
                                str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    try:
        deadline = time.monotonic() + 300
        while "packing" not in (json.loads(out.read_text())["sections"] if out.exists() else {}):
            assert process.poll() is None and time.monotonic() < deadline, "no row was written before the end"
            time.sleep(0.2)
    finally:
        process.kill()
        process.wait()
    packing = json.loads(out.read_text())["sections"]["packing"]
    assert packing["partial"] and len(packing["rows"]) >= 1 and packing["rows"][0]["jobs"] == 1
