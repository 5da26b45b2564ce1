"""`istar cost` (issue 46): the GPU-hours and wall time of config/paper.yaml on two H100s, one job per GPU
and packed, from the rates recorded in istar/pipeline/device_rates.json, which are what the GPU records
in docs/data give."""

import pytest

from bench.device_rates import build
from istar.pipeline.cost import RATES_FILE, config_cost, describe_cost, gpu_kind, load_rates
from istar.pipeline.validate import load_config

from mirrors import REPO


def test_the_paper_config_costs_fewer_gpu_hours_packed_than_one_job_per_gpu():
    config = load_config(REPO / "config" / "paper.yaml", check_paths=False)
    cost = config_cost(config, "h100", 2)
    search = config["search"]
    assert cost["search_fine_tunes"] == (len(config["models"]) * len(config["tasks"]) * len(search["lambdas"])
                                         * len(search["zetas"]) * len(search["seeds"]))
    assert cost["fine_tunes"] > cost["search_fine_tunes"] + 27 * 15  # the final runs and the figure studies
    alone, (packed,) = cost["alone"], cost["packed"]
    assert packed["jobs_per_gpu"] == 10
    assert packed["gpu_hours"][1] < alone["gpu_hours"][0]  # packing: fewer GPU-hours at the worst rate
    for row in (alone, packed):
        low, high = row["gpu_hours"]
        assert 0 < low < high and row["wall_hours"] == pytest.approx([low / 2, high / 2], abs=0.06)
    text = describe_cost(cost)
    assert "one job per GPU" in text and "10 jobs per GPU" in text and "2 × h100" in text


def test_the_rates_are_what_the_gpu_records_give():
    assert load_rates()["kinds"] == build(REPO / "docs" / "data"), \
        f"{RATES_FILE} is stale: run python -m bench.device_rates"


def test_a_kind_without_rates_is_refused_naming_those_measured():
    config = load_config(REPO / "config" / "gpu-study.yaml", check_paths=False)
    with pytest.raises(ValueError, match="no rates measured on 'a100'; measured: h100, h200"):
        config_cost(config, "a100", 1)
    assert gpu_kind("NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04") == "h100" and gpu_kind("NVIDIA H200") == "h200"


def test_the_cost_says_what_the_config_as_written_runs(capsys, monkeypatch):
    """config/paper.yaml as written (the authors' two DDP processes run as one process's micro-batches, three per
    GPU) packs; the same config with two DDP processes per fine-tune does not, and says why; a K not measured
    is a range from the best sharing measured to a job alone, and packing rates measured on other models are
    marked extrapolated."""
    import json

    from istar.cli import main

    config = load_config(REPO / "config" / "paper.yaml", check_paths=False)
    monkeypatch.chdir(REPO)
    assert main(["cost", "--config", "config/paper.yaml", "--gpus", "2", "--kind", "h100", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)["as_written"]
    assert written["jobs_per_gpu"] == config["training"]["jobs_per_gpu"] >= 2 and written["packs"]
    assert written["why_not_packed"] is None and written["gpus_per_fine_tune"] == 1
    cost = config_cost(config, "h100", 2)
    assert written["gpu_hours"] == [cost["packed"][0]["gpu_hours"][0], cost["alone"]["gpu_hours"][1]]
    assert "not measured" in written["rate"] and "extrapolated to albert, bert, distilbert" in written["rate"]

    config["training"]["replicas_as_micro_batches"] = False
    ddp = config_cost(config, "h100", 2)["as_written"]
    assert (ddp["jobs_per_gpu"], ddp["packs"], ddp["gpu_hours"]) == (1, False, cost["alone"]["gpu_hours"])
    assert ddp["why_not_packed"].startswith("training.gpus = 2: each fine-tune holds 2 whole GPUs (DDP)")
    assert "all-reduce not included" in ddp["rate"]
