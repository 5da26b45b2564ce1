"""The library as a researcher's own training code uses it: the public Σ_S, the isotropy measurement in
memory, and the errors of the common mistakes (each naming the fix). Tiny models and a few rows: seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mirrors import REPO
from services import free_port


def test_sigma_and_the_metric_merge_over_two_torch_distributed_ranks(tmp_path):
    """torchrun, two gloo ranks, no accelerate: each rank's shard, one Σ_S and one report, equal to one process's."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()),
                             str(REPO / "tests" / "support" / "distributed_library.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert found["world_size"] == 2 and found["sigma_error"] < 1e-6 * found["sigma_scale"]
        merged, reference = found["merged_report"], found["reference_report"]
        assert merged["tokens"] == reference["tokens"] and merged["global"]["rows"] == reference["global"]["rows"]
        for mine, theirs in zip(merged["layers"], reference["layers"], strict=True):
            for key in ("isoscore", "cosine_similarity", "twonn_cls"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-9), (rank, mine["layer"], key)
