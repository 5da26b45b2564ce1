"""The study bundle's parts (istar.pipeline.bundle, bundle_plan, bundle_run, bundle_import): the float16 model copy,
the refusal of configs that search, the units, the runner's budget and bookkeeping, and the size of
config/gpu-study.yaml's bundle. The whole path, on the CPU without Snakemake: tests/e2e/test_bundle_workflow.py."""

import json

import pytest
import torch
from bundle_helpers import GPU_STUDY
from mirrors import FULL_MIRROR, REPO
from safetensors import safe_open

from istar.config.schema import ConfigError
from istar.pipeline.bundle import DEVICE_LIMIT, build_bundle, save_float16_copy
from istar.pipeline.bundle_plan import confirmatory_problem, plan_jobs, plan_units
from istar.pipeline.bundle_run import unit_range
from istar.pipeline.cost import bundle_call_seconds
from istar.pipeline.validate import merge_config_files, validate_config
from istar.registry.tasks import get_task


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


def test_unit_ranges_and_their_errors():
    assert list(unit_range("2:4", 6)) == [2, 3] and list(unit_range("3", 6)) == [3] and list(unit_range("4:", 6)) == [4, 5]
    for bad in ("5:9", "x", "3:3"):
        with pytest.raises(ValueError, match="--units"):
            unit_range(bad, 6)


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
