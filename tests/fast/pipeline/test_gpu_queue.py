"""The GPU queue (docs/gpu-bundle.md, "The queue", issue 44 item 7), read from the page as a person
running it would: every queued config valid and on config/gpu-study.yaml's recipe, every unit of a
bundle run once by its first-pass calls (so the archives come home as one study), each call as the
table says; with the full releases (the full_release group) each bundle built, its size within what
a device call carries and each call's minutes on an H100 at most 8 and as the table says."""

import json
import re
import shlex

import pytest
from mirrors import FULL_MIRROR, REPO

from istar.pipeline.bundle import DEVICE_LIMIT, build_bundle
from istar.pipeline.bundle_plan import plan_jobs, plan_units
from istar.pipeline.bundle_run import unit_range
from istar.pipeline.cost import bundle_call_seconds
from istar.pipeline.validate import merge_config_files, validate_config

CALL_LIMIT_S = 8 * 60
RECIPE = ("models", "data", "training", "penalty", "shrinkage", "analysis")


def _queue() -> tuple[dict[str, str], list[dict]]:
    """The page's bundles (folder → config) and its calls in rank order, each with its table row."""
    page = (REPO / "docs" / "gpu-bundle.md").read_text(encoding="utf-8")
    section = page.split("## The queue")[1].split("\n## ")[0]
    bundles = {out: config for config, out in re.findall(r"^istar bundle --config (\S+) --mirror \S+ --out (\S+)$",
                                                         section, re.M)}
    rows = re.findall(r"^\| (\d+) \| (\S+) \| (\d+:\d+) \| .+ \| (\d+\.\d)–(\d+\.\d) \|$", section, re.M)
    commands = re.findall(r'^run\(command="(.+)", carry=\["(\S+)"\], timeout_s=(\d+)\)$', section, re.M)
    assert rows and len(rows) == len(commands), "the queue's table and its calls do not pair up"
    calls = []
    for (rank, bundle, units, low, high), (command, carry, timeout) in zip(rows, commands):
        words = shlex.split(command.split("python3 -m istar run-bundle ")[1].split(" 2>&1")[0])
        options = dict(zip(words[1::2], words[2::2]))
        assert words[0] == bundle == carry and options["--units"] == units and int(timeout) == 600, f"rank {rank}"
        calls.append({"rank": int(rank), "bundle": bundle, "units": units, "minutes": (float(low), float(high)),
                      "parallel": int(options["--parallel"]), "rerun": "--workdir" in options})
    assert [call["rank"] for call in calls] == list(range(1, len(calls) + 1))
    return bundles, calls


BUNDLES, CALLS = _queue()


def _config(bundle: str) -> dict:
    return validate_config(merge_config_files([REPO / BUNDLES[bundle]]), check_paths=False)


def test_each_queued_config_is_the_gpu_studys_recipe_and_each_bundle_comes_home_whole():
    gpu_study = validate_config(merge_config_files([REPO / "config" / "gpu-study.yaml"]), check_paths=False)
    assert set(BUNDLES.values()) == {f"config/gpu-queue/{p.name}" for p in (REPO / "config" / "gpu-queue").glob("*.yaml")}
    for bundle in BUNDLES:
        config = _config(bundle)
        jobs, _ = plan_jobs(config, {"minilm": 6})
        # the determinism study differs from the GPU study's recipe in that one setting, which reaches every run
        deterministic = config["training"].pop("deterministic")
        assert deterministic == ("deterministic" in BUNDLES[bundle])
        assert {json.loads(job["step"][-1])["deterministic"] for job in jobs if job["rule"] == "train"} == {deterministic}
        assert {key: config[key] for key in RECIPE} == {key: gpu_study[key] for key in RECIPE} | {
            "training": {k: v for k, v in gpu_study["training"].items() if k != "deterministic"}}, bundle
        count = len(plan_units(jobs))
        ran = sorted(n for call in CALLS if call["bundle"] == bundle and not call["rerun"]
                     for n in unit_range(call["units"], count))
        assert ran == list(range(count)), f"{bundle}: its first-pass calls run units {ran} of {count}"


@pytest.mark.full_release
@pytest.mark.parametrize("bundle", sorted(BUNDLES))
def test_each_queued_bundle_builds_fits_and_each_call_ends_within_8_minutes_on_an_h100(bundle, tmp_path):
    plan = build_bundle([REPO / BUNDLES[bundle]], tmp_path / bundle, mirror=FULL_MIRROR)
    size = plan["size"]
    assert size["bundle_bytes"] + size["tree_bytes"] <= DEVICE_LIMIT
    for call in (c for c in CALLS if c["bundle"] == bundle):
        low, high = bundle_call_seconds(plan, unit_range(call["units"], len(plan["units"])), "h100", call["parallel"])
        print(f"rank {call['rank']}: {bundle} {call['units']}: {low:.0f}–{high:.0f} s on an H100; "
              f"{(size['bundle_bytes'] + size['tree_bytes']) / 2**20:.1f} MiB")
        assert high <= CALL_LIMIT_S, f"rank {call['rank']} may take {high:.0f} s"
        assert (round(low / 60, 1), round(high / 60, 1)) == call["minutes"], \
            f"rank {call['rank']}: the table says {call['minutes']} min, the rates give {low / 60:.1f}–{high / 60:.1f}"
