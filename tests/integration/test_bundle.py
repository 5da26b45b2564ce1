"""The study bundle's parts (istar.pipeline.bundle, bundle_plan, bundle_run, bundle_import): the float16 model copy,
the refusal of configs that search, the units, the runner's budget and bookkeeping, and the size of
config/gpu-study.yaml's bundle. The whole path, on the CPU without Snakemake: tests/e2e/test_bundle_workflow.py."""

import json
import subprocess
import sys
import tarfile

import pytest
from bundle_helpers import GPU_STUDY
from mirrors import REPO, TEST_DATA
from workflow_helpers import ENV

from istar.pipeline.bundle import DEVICE_LIMIT, build_bundle, travelling_bytes
from istar.pipeline.bundle_import import import_bundle
from istar.pipeline.bundle_run import JOBS_FILE, SUMMARY_NAME, run_bundle
from istar.pipeline.validate import merge_config_files
from istar.registry.tasks import get_task


def _select_bundle(folder, estimates):
    """A bundle of `istar select --fixed` jobs only (no model, no data): the runner's bookkeeping, quickly."""
    jobs, units = [], []
    for number, estimate in enumerate(estimates):
        out = f"results/selection/m/task{number}/best.json"
        choice = {"model": "m", "task": "rte", "lam": -1.0, "zeta": 0.2, "tokens": "real", "layers": "all"}
        jobs.append({"rule": "select", "label": f"m/task{number}", "step": ["select", "--out", out, "--fixed", json.dumps(choice)],
                     "launch": False, "gpus": 0, "outputs": [out], "keep": [out], "needs": [],
                     "log": f"logs/select/m/task{number}.log", "estimate_s": estimate})
        units.append({"name": f"select m/task{number}", "jobs": [number], "estimate_s": estimate})
    plan = {"format": 1, "bundle_id": "selects", "precision": "no", "threads": 1, "inputs": [], "jobs": jobs,
            "units": units, "code_sha256": "built", "aggregate": {"runs": [], "selections": [], "measures": []}}
    folder.mkdir()
    (folder / JOBS_FILE).write_text(json.dumps(plan))
    return folder


def _summary(archive):
    with tarfile.open(archive) as handle:
        return json.load(handle.extractfile(SUMMARY_NAME)), sorted(handle.getnames())


def test_runner_keeps_to_its_budget_skips_what_exists_and_what_came_back(tmp_path):
    bundle = _select_bundle(tmp_path / "bundle", [3.0, 1000.0, 3.0])
    first = run_bundle(bundle, tmp_path / "first.tar.gz", budget=60, gpus=0)
    assert {n: u["status"] for n, u in first["units"].items()} == {
        "select m/task0": "done", "select m/task1": "too-large", "select m/task2": "done"}
    summary, names = _summary(tmp_path / "first.tar.gz")
    assert summary == json.loads(json.dumps(first))
    assert "results/selection/m/task0/best.json" in names and "logs/select/m/task2.log" in names
    assert "results/selection/m/task1/best.json" not in names
    # the same work folder again: the done units' outputs exist, so nothing runs, and they are packed again
    again = run_bundle(bundle, tmp_path / "again.tar.gz", budget=60, gpus=0, units="0:1")
    assert again["units"]["select m/task0"]["status"] == "already-done" and again["jobs"] == []
    assert again["units"]["select m/task2"]["status"] == "not-selected"
    # brought back: a new machine (work folder) skips them
    result = import_bundle([tmp_path / "first.tar.gz"], bundle, root=tmp_path / "home")
    assert result["units_left"] == ["select m/task1"] and result["made"] == []
    assert (tmp_path / "home" / "results/selection/m/task2/best.json").is_file()
    fresh = run_bundle(bundle, tmp_path / "fresh.tar.gz", budget=2000, gpus=0, workdir=tmp_path / "fresh")
    assert [u["status"] for u in fresh["units"].values()] == ["brought-back", "done", "brought-back"]
    assert json.loads((bundle / "done.json").read_text())["calibration"] == {}  # select units calibrate nothing
    # an archive whose files differ from those already imported is refused, naming one
    (tmp_path / "home" / "results/selection/m/task0/best.json").write_text("{}")
    with pytest.raises(ValueError, match="task0/best.json"):
        import_bundle([tmp_path / "again.tar.gz"], bundle, root=tmp_path / "home")


def test_run_bundle_names_what_is_not_a_bundle(tmp_path):
    done = subprocess.run([sys.executable, "-m", "istar", "run-bundle", str(tmp_path), "--out", str(tmp_path / "x.tar.gz")],
                          capture_output=True, text=True, env=ENV, cwd=REPO)
    assert done.returncode == 2 and "is not a study bundle" in done.stderr and "istar bundle" in done.stderr


def test_gpu_study_bundle_fits_what_a_device_call_carries(tmp_path):
    # Built from the test data (a few hundred rows per task); the data of the full releases, which
    # the test data is a slice of, projected from its bytes per row (the model is the real one).
    subset = tmp_path / "subset.yaml"
    subset.write_text(f"data:\n  mirror: {TEST_DATA}\n  subset: true\n")
    plan = build_bundle([GPU_STUDY, subset], tmp_path / "gpu-bundle", with_data=["rte"])
    bundle = tmp_path / "gpu-bundle"
    config = merge_config_files([GPU_STUDY])
    projected = plan["size"]["bundle_bytes"]
    for task in ("sst2", "mrpc", "rte"):
        meta = json.loads((bundle / "resources" / "data" / task / "meta.json").read_text())
        official = get_task(task).rows
        for split, rows, cap in (("train", official[0], config["data"]["max_train_samples"]), ("validation", official[1], None)):
            size = (bundle / "resources" / "data" / task / f"{split}.parquet").stat().st_size
            kept = min(rows, cap) if cap else rows
            projected += size * (kept / meta["rows"][split] - 1)
    total = projected + travelling_bytes(REPO, bundle)
    print(f"gpu-study bundle: {plan['size']['bundle_bytes'] / 2**20:.1f} MiB from the test data, "
          f"{total / 2**20:.1f} MiB projected with the full data and the working tree")
    assert total < DEVICE_LIMIT
    assert plan["models"]["minilm"]["float16"]["max_relative_error"] <= 2.0 ** -11
