"""What the parts of one test module split by lane share (helpers and fixtures):
tests/e2e/test_reliability_early.py, tests/fast/test_reliability_early.py, tests/integration/test_reliability_early.py."""

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mirrors import REPO, TEST_DATA

from istar.core.covariance import CovarianceAccumulator

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def demo() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["data"]["mirror"] = str(REPO / "config" / "demo-data")
    return config


# ----------------------------------------------------------------------------- names that cannot be paths


LONG = "m" * 300


# ----------------------------------------------------------------------------- data files that are not UTF-8


def with_byte(source: Path, target: Path, after: bytes, byte: bytes = b"\xe9") -> Path:
    """A copy of ``source`` with ``byte`` written over the byte after the first ``after`` (as Latin-1 would)."""
    data = source.read_bytes()
    at = data.index(after) + len(after)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data[:at] + byte + data[at + 1:])
    return target


# ----------------------------------------------------------------------------- what a measurement or a run is given


@pytest.fixture(scope="module")
def inputs(tiny_runs, tiny_sigma, prepared, tmp_path_factory):
    """The session's finished CosReg run of the tiny model on RTE, the Σ_S of RTE and of SST-2, and
    RTE prepared a second time with other settings; copy the run before changing it."""
    from istar.data import prepare_task

    again = tmp_path_factory.mktemp("inputs") / "rte-again"
    prepare_task("rte", again, source="mirror", mirror=TEST_DATA, subset=True, max_train_samples=40,
                 max_eval_samples=24, seed=0)
    return {"run": tiny_runs["folders"][("cosreg_lam1", 0)], "sigma": {task: tiny_sigma(task) for task in ("rte", "sst2")},
            "rte": prepared("rte"), "sst2": prepared("sst2"), "rte_again": again}


def sigma_like(path: Path, dim: int, hidden_states: int, provenance: dict) -> Path:
    from istar.core.shrinkage import save_shrinkage

    generator = torch.Generator().manual_seed(0)
    per_layer = []
    for _ in range(hidden_states):
        accumulator = CovarianceAccumulator(dim)
        accumulator.add(torch.randn(50, dim, generator=generator, dtype=torch.float64))
        per_layer.append(accumulator)
    save_shrinkage(path, per_layer, list(range(1, hidden_states)), provenance)
    return path
