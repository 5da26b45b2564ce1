"""The study bundle's parts (istar.pipeline.bundle, bundle_plan, bundle_run, bundle_import): the float16 model copy,
the refusal of configs that search, the units, the runner's budget and bookkeeping, and the size of
config/gpu-study.yaml's bundle. The whole path, on the CPU without Snakemake: tests/workflow/test_bundle_workflow.py."""

import json
import subprocess
import sys
import tarfile

import pytest
import torch
from mirrors import FULL_MIRROR, REPO, TEST_DATA
from safetensors import safe_open
from workflow_helpers import ENV

from istar.config.schema import ConfigError
from istar.pipeline.bundle import DEVICE_LIMIT, build_bundle, save_float16_copy, travelling_bytes
from istar.pipeline.bundle_plan import confirmatory_problem, plan_jobs, plan_units
from istar.pipeline.bundle_import import import_bundle
from istar.pipeline.bundle_run import JOBS_FILE, SUMMARY_NAME, run_bundle, unit_range
from istar.pipeline.cost import bundle_call_seconds
from istar.pipeline.validate import merge_config_files, validate_config
from istar.registry.tasks import get_task

GPU_STUDY = REPO / "config" / "gpu-study.yaml"


def test_the_float16_copy_loads_back_as_float32_master_weights(tiny_model_dir, tmp_path):
    from istar.models.loading import load_model

    report = save_float16_copy(str(tiny_model_dir), tmp_path / "copy")
    with safe_open(str(tmp_path / "copy" / "model.safetensors"), "pt") as stored:
        assert {stored.get_tensor(name).dtype for name in stored.keys()} == {torch.float16}
    original = load_model(str(tiny_model_dir), get_task("sst2"))
    copy = load_model(str(tmp_path / "copy"), get_task("sst2"))
    # transformers 5 would keep a float16 checkpoint in float16; the fp16 gradient scaler needs float32 weights
    assert {p.dtype for p in copy.parameters()} == {torch.float32}
    for (name, a), b in zip(original.bert.state_dict().items(), copy.bert.state_dict().values(), strict=True):
        assert torch.equal(b, a.half().float()), name  # exactly the original rounded to float16
    assert 0 < report["max_relative_error"] <= 2.0 ** -11
    assert (tmp_path / "copy" / "tokenizer.json").is_file() and (tmp_path / "copy" / "digests.json").is_file()


def _config(**final):
    config = merge_config_files([GPU_STUDY])
    config["final"].update(final)
    return validate_config(config, check_paths=False)


def test_a_config_that_searches_or_tunes_is_refused_naming_the_key():
    searched = _config(istar={"minilm": {"sst2": {"lam": -5, "zeta": 0.6}}})  # mrpc not fixed
    assert "final.istar.minilm.mrpc" in confirmatory_problem(searched)
    with pytest.raises(ConfigError, match="final.istar"):
        plan_jobs(searched, {"minilm": 6})
    tuned = _config()
    tuned["studies"]["padding"].update(enabled=True, lam="tuned", zeta="tuned")
    assert "studies.padding.lam" in confirmatory_problem(tuned)
    tuned_base = _config()
    tuned_base["search"].update(tune_baselines=True, batch_sizes=[32], epochs=[3], learning_rates=[2e-5, 5e-5])
    assert "search.tune_baselines" in confirmatory_problem(tuned_base)
    hub = _config()
    hub["data"]["source"] = "hub"
    assert "data.source" in confirmatory_problem(hub)
    assert confirmatory_problem(_config()) is None


def test_gpu_study_plan_units_keep_each_setting_with_its_measurement():
    jobs, aggregate = plan_jobs(_config(), {"minilm": 6})
    units = plan_units(jobs)
    rules = [job["rule"] for job in jobs]
    assert rules.count("train") == 2 * 2 * 10 and rules.count("measure") == 4 and rules.count("select") == 2
    assert sorted(rules.count(r) for r in ("shrinkage", "shrinkage_all_positions")) == [2, 2]
    assert [unit["name"] for unit in units[:2]] == ["select minilm/sst2", "select minilm/mrpc"]
    trains = [index for index, job in enumerate(jobs) if job["rule"] == "train"]
    assert sorted(i for unit in units for i in unit["jobs"] if jobs[i]["rule"] == "train") == trains
    for unit in units[2:]:
        produced = {path for index in unit["jobs"] for path in jobs[index]["outputs"]}
        measure = next(jobs[i] for i in unit["jobs"] if jobs[i]["rule"] == "measure")
        assert all(path in produced or path.endswith("sigma0.pt") for path in measure["needs"])
        assert len(unit["jobs"]) == 11
    spec = json.loads(next(job for job in jobs if job["label"] == "minilm/sst2/istar_lam-5_zeta0.6_allpos/seed3")["step"][-1])
    assert (spec["lam"], spec["zeta"], spec["tokens"], spec["scheduler"], spec["weight_decay"], spec["adam_epsilon"],
            spec["max_grad_norm"], spec["mixed_precision"]) == (-5.0, 0.6, "all_positions", "constant", 0.0, 1e-6, 0, "fp16")
    assert spec["sigma_s"] == "resources/shrinkage/minilm/sst2/sigma0_allpos.pt"
    assert len(aggregate["runs"]) == 40 and len(aggregate["measures"]) == 4


def test_runs_a_study_shares_with_the_final_stage_make_one_unit():
    config = merge_config_files([GPU_STUDY])
    config["studies"]["lambda_sweep"] = {"enabled": True, "lambdas": [-5], "zeta": 0.6, "tasks": ["sst2"], "seeds": [0, 1]}
    jobs, _ = plan_jobs(validate_config(config, check_paths=False), {"minilm": 6})
    shared = [unit for unit in plan_units(jobs) if "+" in unit["name"]]
    assert len(shared) == 1 and sum(jobs[i]["rule"] == "measure" for i in shared[0]["jobs"]) == 2
    assert sum(jobs[i]["rule"] == "train" for i in shared[0]["jobs"]) == 10  # seeds 0, 1 trained once


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


@pytest.mark.integration
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


def test_unit_ranges_and_their_errors():
    assert list(unit_range("2:4", 6)) == [2, 3] and list(unit_range("3", 6)) == [3] and list(unit_range("4:", 6)) == [4, 5]
    for bad in ("5:9", "x", "3:3"):
        with pytest.raises(ValueError, match="--units"):
            unit_range(bad, 6)


@pytest.mark.integration
def test_run_bundle_names_what_is_not_a_bundle(tmp_path):
    done = subprocess.run([sys.executable, "-m", "istar", "run-bundle", str(tmp_path), "--out", str(tmp_path / "x.tar.gz")],
                          capture_output=True, text=True, env=ENV, cwd=REPO)
    assert done.returncode == 2 and "is not a study bundle" in done.stderr and "istar bundle" in done.stderr


@pytest.mark.integration
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


@pytest.mark.full_release
def test_gpu_study_bundle_from_the_full_releases_fits(tmp_path):
    plan = build_bundle([GPU_STUDY], tmp_path / "gpu-bundle", mirror=FULL_MIRROR, with_data=["rte"])
    size = plan["size"]
    print(f"gpu-study bundle {size['bundle_bytes'] / 2**20:.1f} MiB + tree {size['tree_bytes'] / 2**20:.1f} MiB; "
          f"estimated {plan['estimate']['total_s'] / 60:.1f} min on one H100")
    assert size["bundle_bytes"] + size["tree_bytes"] < DEVICE_LIMIT
    assert max(unit["estimate_s"] for unit in plan["units"]) < 400  # each setting fits a device call with room to spare
    # the measured rates bracket the calls that ran this bundle whole (istar cost --bundle; the queue's minutes)
    for kind, record in (("h100", "gpu-study-repeats/h100-bundle-call.json"), ("h200", "gpu-study/bundle-call.json")):
        call = json.loads((REPO / "docs" / "data" / record).read_text())
        low, high = bundle_call_seconds(plan, range(len(plan["units"])), kind, call["parallel"])
        assert low < call["seconds"] < high, (kind, low, call["seconds"], high)
