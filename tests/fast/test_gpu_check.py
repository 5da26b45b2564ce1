"""The GPU check (bench/gpu_check.py) in its reduced CPU form, end to end, and the GPU study
config (config/gpu-study.yaml) as a Snakemake dry run."""

from bench.gpu_check import steps_taken


def test_steps_taken_counts_learning_rate_moves():
    # linear decay from 1e-4 over 4 steps, the scaler skipping the first and third attempt
    assert steps_taken([1e-4, 7.5e-5, 7.5e-5, 5e-5, 2.5e-5, 0.0], initial_lr=1e-4) == 4
    assert steps_taken([1e-4, 1e-4], initial_lr=1e-4) == 0
