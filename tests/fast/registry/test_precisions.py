"""The precision policy (istar.registry.precisions): what runs where, and the processor's bf16 detection."""

import json
import platform
from pathlib import Path

import pytest
from mirrors import REPO

import yaml

from istar.pipeline.plan import measure_spec, shrinkage_spec
from istar.pipeline.validate import validate_config
from istar.registry.precisions import (BF16_CPU_FLAGS, PRECISIONS, cpu_flags, cpu_has_native_bf16, run_dtype,
                                       run_precision)
from istar.steps.launch import launch_command, step_precision


@pytest.mark.parametrize("requested, native, device, expected", [
    ("no", True, "cpu", "fp32"), ("no", False, "cpu", "fp32"),
    ("fp16", True, "cpu", "bf16"), ("fp16", False, "cpu", "fp32"),
    ("bf16", True, "cpu", "bf16"), ("bf16", False, "cpu", "fp32"),
    ("fp16", False, "cuda", "fp16"), ("bf16", False, "cuda", "bf16"), ("no", True, "cuda", "fp32"),
])
def test_run_precision_policy(requested, native, device, expected):
    ran = run_precision(requested, device, native_bf16=native)
    assert ran.label == expected
    assert ran is PRECISIONS[ran.key]  # the key goes to accelerate as it is


@pytest.mark.parametrize("requested, native, device, expected", [
    ("float32", True, "cpu", "float32"), ("bfloat16", True, "cpu", "bfloat16"), ("float16", True, "cpu", "bfloat16"),
    ("bfloat16", False, "cpu", "float32"), ("float16", False, "cpu", "float32"),
    ("float16", False, "cuda", "float16"), ("bfloat16", False, "cuda", "bfloat16"),
])
def test_profile_dtype_follows_the_same_rule(requested, native, device, expected):
    assert run_dtype(requested, device, native_bf16=native) == expected


def test_unknown_dtype_is_named():
    with pytest.raises(ValueError, match=r"unknown dtype 'int8' \(survey.dtype\); known dtypes: float32, float16, bfloat16"):
        run_dtype("int8", "cpu")


@pytest.mark.parametrize("precision", ["no", "fp16", "bf16"])
def test_sigma_and_measure_jobs_run_in_the_training_precision(precision):
    # The initial Σ_S and the measurements use the arithmetic of the runs they serve.
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["training"]["mixed_precision"] = precision
    config = validate_config(config)
    sigma = shrinkage_spec(config, model="m", task="rte", data_dir="d", out="s.pt")
    measured = measure_spec(config, runs=["r"], task="rte", data_dir="d", sigma_s="s.pt", out="m.json")
    assert sigma.mixed_precision == measured.mixed_precision == measured.model_data("r").mixed_precision == precision


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match=r"unknown precision 'fp8' \(training.mixed_precision\); known precisions: no, fp16, bf16"):
        run_precision("fp8", "cpu")


def test_cpu_flags_read_x86_and_arm_formats(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\n")
    assert cpu_flags(x86) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert cpu_flags(arm) & BF16_CPU_FLAGS == {"bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux's /proc/cpuinfo")
def test_detection_agrees_with_the_processor_flags():
    # torch's cpuinfo probe and the kernel's flags describe the same processor.
    assert cpu_has_native_bf16() == bool(cpu_flags() & BF16_CPU_FLAGS), (platform.processor(), sorted(cpu_flags()))


def test_the_precision_takes_one_route_the_steps_spec():
    # The launcher is told the GPU count only: accelerate gets the precision of the step's spec (or of
    # the step's own flag), and the step's arguments go through unchanged, so nothing overrides its spec.
    step = ["train", "--spec", json.dumps({"mixed_precision": "bf16"})]
    assert launch_command(0, step)[-3:] == step
    gpu = launch_command(1, step)
    assert gpu[gpu.index("--mixed_precision") + 1] == "bf16" and gpu[-3:] == step
    assert step_precision(["measure", "--runs", "r", "--mixed-precision", "fp16"]) == "fp16"
    assert step_precision(["train", "--model", "m"]) == "no"
