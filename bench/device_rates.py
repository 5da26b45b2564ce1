"""The per-job rates ``istar cost`` reads (istar/pipeline/device_rates.json), rebuilt from the GPU records.

    python -m bench.device_rates [--records docs/data] [--check]

Every GPU call whose records are imported into ``docs/data`` calibrates them (run it after an
import; ``--check`` exits 1 when the file is not what the records give, as the test suite does):

- ``step_factor``: each ``bench/gpu_check.py`` training step (base, CosReg, I-STAR, 32 × 128 in
  fp16) over the bundle's estimate for that encoder and batch
  (:meth:`istar.pipeline.bundle_plan.DeviceCosts.step_s`): how much longer a job alone on the
  GPU takes than the estimate, lowest and highest seen on that kind of GPU.
- ``packed_ratio``: for each ``--parallel K`` of a ``run-bundle`` call, each fine-tune's seconds over
  K × its estimate alone: the GPU time one job costs when K share the GPU, relative to the estimate.
- ``packed_models``: the configured models whose fine-tunes those calls packed (a rate applied to
  another model is extrapolated to it, and ``istar cost`` says so).
- ``job_factor``: the other jobs of those calls (``measure``, ``shrinkage`` of either token
  selection, ``select``), each one's seconds over its estimate, per rule: what
  :func:`istar.pipeline.cost.bundle_call_seconds` sizes a device call with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from istar.pipeline.bundle_plan import DeviceCosts
from istar.pipeline.cost import RATES_FILE, gpu_kind

REPO = Path(__file__).resolve().parents[1]
# The encoders bench/gpu_check.py times: (layers, hidden, feed-forward) as in their config.json
GPU_CHECK_ENCODERS = {12: (12, 768, 3072), 6: (6, 384, 1536)}


def step_estimate(layers: int, hidden: int, ffn: int, tokens: int, penalised: bool) -> float:
    body = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    return DeviceCosts().step_s(layers, body, tokens, penalised)


def step_factors(check: dict) -> list[float]:
    """Measured over estimated step seconds of every encoder and method of one gpu_check record."""
    factors = []
    for row in check["sections"]["train_step"]["rows"]:
        layers, hidden, ffn = GPU_CHECK_ENCODERS[row["layers"]]
        tokens = row["batch"][0] * row["batch"][1]
        for method, timing in row["methods"].items():
            factors.append(timing["median_s"] / step_estimate(layers, hidden, ffn, tokens, method != "base"))
    return factors


def packed_ratios(call: dict) -> list[float]:
    """Each fine-tune's seconds over ``parallel`` × its estimate alone, in one run-bundle call."""
    parallel = call["parallel"]
    return [job["seconds"] / (parallel * job["estimate_s"]) for job in call["jobs"]
            if job["rule"] == "train" and job["returncode"] == 0]


def job_factors(call: dict) -> dict[str, list[float]]:
    """Each job other than a fine-tune, its seconds over its estimate, by rule (the Σ_S rules as one)."""
    factors: dict[str, list[float]] = {}
    for job in call["jobs"]:
        if job["rule"] != "train" and job["returncode"] == 0:
            rule = "shrinkage" if job["rule"].startswith("shrinkage") else job["rule"]
            factors.setdefault(rule, []).append(job["seconds"] / job["estimate_s"])
    return factors


def _kind() -> dict:
    return {"step_factor": [], "packed_ratio": {}, "packed_models": set(), "job_factor": {}, "sources": []}


def build(records: Path) -> dict:
    rates: dict = {}
    for path in sorted(records.rglob("*gpu_check*.json")):
        check = json.loads(path.read_text(encoding="utf-8"))
        kind = rates.setdefault(gpu_kind(check["environment"]["gpu"]), _kind())
        kind["step_factor"] += step_factors(check)
        kind["sources"].append(str(path.relative_to(REPO)))
    for path in sorted(records.rglob("*bundle-call.json")):
        call = json.loads(path.read_text(encoding="utf-8"))
        kind = rates.setdefault(gpu_kind(call["device"]["gpus"][0]), _kind())
        kind["packed_ratio"].setdefault(str(call["parallel"]), []).extend(packed_ratios(call))
        kind["packed_models"] |= {job["label"].split("/")[0] for job in call["jobs"] if job["rule"] == "train"}
        for rule, factors in job_factors(call).items():
            kind["job_factor"].setdefault(rule, []).extend(factors)
        kind["sources"].append(str(path.relative_to(REPO)))
    return {name: {"step_factor": [round(min(k["step_factor"]), 3), round(max(k["step_factor"]), 3)],
                   "packed_ratio": {parallel: [round(min(r), 3), round(max(r), 3)]
                                    for parallel, r in sorted(k["packed_ratio"].items(), key=lambda i: int(i[0]))},
                   "packed_models": sorted(k["packed_models"]),
                   "job_factor": {rule: [round(min(r), 3), round(max(r), 3)] for rule, r in sorted(k["job_factor"].items())},
                   "sources": sorted(k["sources"])}
            for name, k in sorted(rates.items()) if k["step_factor"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=REPO / "docs" / "data")
    parser.add_argument("--check", action="store_true", help="exit 1 if the rates file is not what the records give")
    args = parser.parse_args(argv)
    kinds = build(args.records.resolve())
    recorded = json.loads(RATES_FILE.read_text(encoding="utf-8"))
    if args.check:
        if recorded["kinds"] != kinds:
            print(f"{RATES_FILE} is not what the records give; run python -m bench.device_rates", file=sys.stderr)
            return 1
        return 0
    RATES_FILE.write_text(json.dumps({**recorded, "kinds": kinds}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(kinds, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
