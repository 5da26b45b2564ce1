"""What the parts of one test module split by lane share (helpers and fixtures):
tests/e2e/test_survey.py, tests/fast/steps/test_survey.py, tests/integration/test_survey.py."""

import json
import math

import numpy as np
import pytest
import torch
from fixture_parts import MINILM

from istar.cli import main
from istar.core.baseline_measures import FP32_EXP_LIMIT

SENTENCES = [
    "The cat sat on the mat and looked out of the window.",
    "Stock markets fell sharply on Monday after the announcement.",
    "She plays the violin in a small orchestra every weekend.",
    "Heavy rain is expected across the north of the country tomorrow.",
    "The committee approved the new budget by a narrow margin.",
    "A short walk along the river brought them to the old mill.",
    "Researchers measured the isotropy of every layer of the network.",
    "He forgot his keys again, so he waited for his sister.",
    "The museum opens at nine and closes early on Sundays.",
    "Fresh bread and coffee were served in the courtyard.",
    "Two trains collided near the station, but nobody was hurt.",
    "The recipe calls for three eggs, flour, butter and a pinch of salt.",
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text("\n".join(SENTENCES) + "\n\n")
    return path


# ------------------------------------------------------------------ independent formulas (NumPy)


def numpy_isoscore(W: np.ndarray) -> float:
    """Algorithm 2 step by step: eigenvalues of the covariance, normalise, distance to the identity."""
    lam = np.linalg.eigvalsh(np.cov(W, rowvar=False))
    d = lam.size
    lam_hat = math.sqrt(d) * lam / np.linalg.norm(lam)
    delta = np.linalg.norm(lam_hat - 1) / math.sqrt(2 * (d - math.sqrt(d)))
    phi = (d - delta**2 * (d - math.sqrt(d))) ** 2 / d**2
    return (d * phi - 1) / (d - 1)


def numpy_partition(W: np.ndarray) -> float:
    """min/max of Z(c) = Σ exp(cᵀx) over ±eigenvectors of WᵀW, shifted by the largest exponent."""
    _, vectors = np.linalg.eigh(W.T @ W)
    exponents = np.concatenate([W @ vectors, -(W @ vectors)], axis=1)
    shift = exponents.max()
    z = np.exp(exponents - shift).sum(axis=0)
    return float(z.min() / z.max())


def authors_recipe(W: torch.Tensor) -> float:
    """I(W) step by step as Machina & Mercer's script computes it: float32, CPU, eigh's signs, plain exp."""
    W = W.detach().to("cpu", torch.float32)
    _, vectors = torch.linalg.eigh(torch.mm(W.T, W))
    z = torch.exp(torch.mm(W, vectors)).sum(dim=0)
    return float(z.min() / z.max())


def check_static_independently(measures: dict, W: np.ndarray) -> None:
    centred = W - W.mean(axis=0)
    assert measures["isoscore"] == pytest.approx(numpy_isoscore(W), abs=1e-9)
    assert measures["partition_isotropy_both_signs"] == pytest.approx(numpy_partition(W), rel=1e-8)
    assert measures["partition_isotropy_both_signs_centred"] == pytest.approx(numpy_partition(centred), rel=1e-8)
    # the one-sign recipe, in float32 with a plain exp as the authors run it (these weights do not overflow)
    assert measures["partition_isotropy_solver_signs"] == pytest.approx(authors_recipe(torch.from_numpy(W)), rel=2e-5)
    assert measures["partition_isotropy_solver_signs_centred"] == pytest.approx(
        authors_recipe(torch.from_numpy(centred)), rel=2e-5)
    assert measures["partition_isotropy_both_signs"] <= measures["partition_isotropy_solver_signs"]
    assert not measures["solver_signs_fp32_overflow"] and measures["solver_signs_max_exponent"] < FP32_EXP_LIMIT
    unit_sum = (W / np.linalg.norm(W, axis=1, keepdims=True)).sum(axis=0)
    n = len(W)
    assert measures["average_cosine"] == pytest.approx((unit_sum @ unit_sum - n) / (n * (n - 1)), abs=1e-10)
    variances = np.var(W, axis=0, ddof=1)
    assert measures["outlier_dims"] == int((variances > 5 * variances.mean()).sum())
    assert measures["top1_dim_variance_share"] == pytest.approx(variances.max() / variances.sum(), rel=1e-9)


# ------------------------------------------------------------------ MiniLM (encoder)


@pytest.fixture(scope="module")
def minilm_profile(tmp_path_factory, text_file):
    out = tmp_path_factory.mktemp("profile") / "minilm.json"
    assert main(["survey", "--model", MINILM, "--text", str(text_file), "--tokens", "80", "--sigma-tokens", "50",
                 "--batch-size", "4", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())
