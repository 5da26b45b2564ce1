"""Tests of the measures: IsoScore and IsoScore* (istar.core.isotropy), the streaming covariance
(istar.core.covariance), TwoNN (istar.core.twonn) and the measures IsoScore replaces (istar.core.baseline_measures)."""


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from istar.core.baseline_measures import average_cosine_similarity, partition_isotropy
from istar.core.covariance import CovarianceAccumulator
from istar.core.isotropy import (
    isoscore,
    isoscore_from_eigenvalues,
    isoscore_star,
    isoscore_star_from_covariance,
)
from istar.core.twonn import twonn_dimension


def random_orthogonal(d, generator):
    q, r = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=generator))
    return q * torch.sign(torch.diagonal(r))


def random_covariance(d, rank, generator):
    a = torch.randn(d, rank, dtype=torch.float64, generator=generator)
    scales = torch.rand(rank, dtype=torch.float64, generator=generator) * 10
    return (a * scales) @ a.T


# ---------------------------------------------------------------- IsoScore basics


def test_isotropic_gaussian_scores_near_one():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(50_000, 16, dtype=torch.float64, generator=g)
    assert isoscore(X) > 0.99
    assert float(isoscore_star(X)) > 0.99


def test_rank_one_data_scores_zero():
    g = torch.Generator().manual_seed(1)
    direction = torch.randn(32, dtype=torch.float64, generator=g)
    X = torch.randn(500, 1, dtype=torch.float64, generator=g) * direction + 3.0
    assert isoscore(X) == pytest.approx(0.0, abs=1e-9)
    assert float(isoscore_star(X)) == pytest.approx(0.0, abs=1e-9)


def test_paper_gaussian_true_value_and_small_sample_underestimate():
    # docs/method.md §2: diag(10, 6, 4, 4, 1, ..., 1) in 768-d has IsoScore* ≈ 0.86.
    variances = torch.ones(768, dtype=torch.float64)
    variances[:4] = torch.tensor([10.0, 6.0, 4.0, 4.0])
    true_value = float(isoscore_star_from_covariance(torch.diag(variances)))
    assert true_value == pytest.approx(0.8674, abs=1e-3)
    g = torch.Generator().manual_seed(2)
    sample = torch.randn(700, 768, dtype=torch.float64, generator=g) * variances.sqrt()
    assert isoscore(sample) < true_value - 0.3


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3), shift=st.floats(-1e3, 1e3))
def test_invariant_under_rotation_scaling_and_translation(seed, scale, shift):
    g = torch.Generator().manual_seed(seed)
    d = 6
    X = torch.randn(200, d, dtype=torch.float64, generator=g) * torch.linspace(0.1, 3.0, d, dtype=torch.float64)
    Q = random_orthogonal(d, g)
    offset = shift * torch.randn(d, dtype=torch.float64, generator=g)
    reference = float(isoscore_star(X))
    assert float(isoscore_star(X @ Q.T)) == pytest.approx(reference, abs=1e-10)
    assert float(isoscore_star(scale * X)) == pytest.approx(reference, abs=1e-10)
    assert float(isoscore_star(X + offset)) == pytest.approx(reference, abs=1e-8)
    assert isoscore(X @ Q.T) == pytest.approx(reference, abs=1e-10)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 40), rank_fraction=st.floats(0.01, 1.0),
       zeta=st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))
def test_closed_form_equals_eigenvalue_definition(seed, d, rank_fraction, zeta):
    g = torch.Generator().manual_seed(seed)
    cov_x = random_covariance(d, max(1, int(rank_fraction * d)), g)
    sigma_s = random_covariance(d, d, g)
    closed = float(isoscore_star_from_covariance(cov_x, zeta, sigma_s))
    # the definition: IsoScore of the RDA-shrunk covariance Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S (Algorithm 1, step 4)
    literal = isoscore_from_eigenvalues(torch.linalg.eigvalsh((1.0 - zeta) * cov_x + zeta * sigma_s))
    assert closed == pytest.approx(literal, abs=1e-10)
    assert -1e-12 <= closed <= 1 + 1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 60), d=st.integers(2, 30))
def test_isoscore_star_at_zeta_zero_equals_isoscore(seed, n, d):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, dtype=torch.float64, generator=g) * torch.rand(d, dtype=torch.float64, generator=g)
    assert float(isoscore_star(X, zeta=0.0)) == pytest.approx(isoscore(X), abs=1e-10)


def test_points_and_covariance_entry_points_agree():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(300, 12, dtype=torch.float64, generator=g) @ torch.randn(12, 12, dtype=torch.float64, generator=g)
    sigma_s = random_covariance(12, 12, g)
    for zeta in (0.0, 0.3, 1.0):
        assert float(isoscore_star(X, zeta, sigma_s)) == pytest.approx(
            float(isoscore_star_from_covariance(torch.cov(X.T), zeta, sigma_s)), abs=1e-12
        )


def test_zeta_one_ignores_the_batch():
    g = torch.Generator().manual_seed(4)
    sigma_s = random_covariance(8, 8, g)
    a = torch.randn(50, 8, dtype=torch.float64, generator=g)
    b = torch.randn(50, 8, dtype=torch.float64, generator=g) * 7
    assert float(isoscore_star(a, 1.0, sigma_s)) == pytest.approx(float(isoscore_star(b, 1.0, sigma_s)), abs=1e-12)


# ---------------------------------------------------------------- gradients and precision


@pytest.mark.parametrize("zeta", [0.0, 0.2, 0.9])
def test_gradcheck_points(zeta):
    g = torch.Generator().manual_seed(5)
    X = (torch.randn(20, 5, dtype=torch.float64, generator=g) * torch.tensor([3.0, 2.0, 1.0, 0.5, 0.1], dtype=torch.float64)).requires_grad_()
    sigma_s = random_covariance(5, 5, g)
    assert torch.autograd.gradcheck(lambda x: isoscore_star(x, zeta, sigma_s), (X,))


def test_gradcheck_points_with_repeated_eigenvalues():
    # An isotropic-by-construction sample: eigen/SVD gradients are unstable here, the closed form is not.
    X = torch.cat([torch.eye(4, dtype=torch.float64), -torch.eye(4, dtype=torch.float64)]).requires_grad_()
    assert isoscore_star(X).item() == pytest.approx(1.0, abs=1e-12)
    assert torch.autograd.gradcheck(isoscore_star, (X,))


def test_gradcheck_covariance():
    g = torch.Generator().manual_seed(6)
    cov = random_covariance(6, 6, g).requires_grad_()
    sigma_s = random_covariance(6, 3, g)
    assert torch.autograd.gradcheck(lambda c: isoscore_star_from_covariance(c, 0.4, sigma_s), (cov,))


def test_custom_backward_matches_autograd_through_covariance():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(100, 9, dtype=torch.float64, generator=g) * torch.arange(1, 10, dtype=torch.float64)
    sigma_s = random_covariance(9, 9, g)
    a = X.clone().requires_grad_()
    isoscore_star(a, 0.3, sigma_s).backward()
    b = X.clone().requires_grad_()
    isoscore_star_from_covariance(torch.cov(b.T), 0.3, sigma_s).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_input_matches_float32(half):
    g = torch.Generator().manual_seed(8)
    X = torch.randn(2048, 64, generator=g) * torch.linspace(0.2, 4.0, 64) + 2.0
    sigma_s = torch.cov(torch.randn(5000, 64, generator=g).T)
    Xh = X.to(half)
    reference = float(isoscore_star(Xh.float(), 0.2, sigma_s))
    got = isoscore_star(Xh.requires_grad_(), 0.2, sigma_s)
    assert got.item() == pytest.approx(reference, abs=1e-3)
    got.backward()
    assert Xh.grad.dtype == half and torch.isfinite(Xh.grad.float()).all()


@pytest.mark.parametrize("half, score_bound, gradient_bound", [(torch.bfloat16, 2e-4, 1.5e-2),
                                                                   (torch.float16, 2e-4, 2e-3)])
@pytest.mark.parametrize("n, d", [(2048, 64), (256, 768)])
def test_autocast_product_stays_close_to_float64(half, score_bound, gradient_bound, n, d):
    """Under autocast the product X_cᵀX_c runs in the autocast dtype (fp32 accumulation, rows scaled against
    fp16 overflow; the d × d reductions in float64): score and gradient stay within a few units of that dtype's
    rounding of the float64 values (measured: bench/RESULTS.md), on points with an offset and an outlying
    dimension 20 × the others; without autocast the float32 product is unchanged."""
    from bench.isoscore_star import product_accuracy, sample_points

    X, sigma_s = sample_points(n, d)
    reduced = product_accuracy(X, sigma_s, half)
    assert 0 < reduced["score_error"] <= score_bound  # > 0: the reduced product did run
    assert reduced["gradient_relative_error"] <= gradient_bound
    full = product_accuracy(X, sigma_s, None)
    assert full["score_error"] <= 1e-7 and full["gradient_relative_error"] <= 1e-5


def test_autocast_product_cannot_overflow_float16():
    """Values whose squares summed over the rows pass fp16's range (65,504) still give a finite, accurate score."""
    g = torch.Generator().manual_seed(9)
    X = torch.randn(4096, 32, generator=g) * torch.linspace(50.0, 400.0, 32)
    with torch.autocast("cpu", dtype=torch.float16):
        inside = float(isoscore_star(X))
    assert inside == pytest.approx(float(isoscore_star(X.double())), abs=2e-4)


# ---------------------------------------------------------------- edge cases


@pytest.mark.parametrize(
    "X, message",
    [
        (torch.ones(1, 5), "at least 2 points"),
        (torch.randn(10, 1), "d ≥ 2"),
        (torch.ones(10, 5), "zero total variance"),
        (torch.tensor([[1.0, 2.0], [float("nan"), 1.0], [0.0, 1.0]]), "NaN or inf"),
        (torch.tensor([[1.0, 2.0], [float("inf"), 1.0], [0.0, 1.0]]), "NaN or inf"),
        (torch.randn(10), "2-D"),
    ],
)
def test_bad_input_raises_clear_errors(X, message):
    with pytest.raises(ValueError, match=message):
        isoscore_star(X)
    with pytest.raises(ValueError, match=message):
        isoscore(X)


def test_bad_shrinkage_arguments():
    X = torch.randn(10, 3)
    for zeta in (1.5, float("nan")):
        with pytest.raises(ValueError, match=r"zeta must lie in \[0, 1\]"):
            isoscore_star(X, zeta=zeta, sigma_s=torch.eye(3))
    with pytest.raises(ValueError, match="needs a shrinkage covariance"):
        isoscore_star(X, zeta=0.2)
    with pytest.raises(ValueError, match="d = 3"):
        isoscore_star(X, zeta=0.2, sigma_s=torch.eye(4))


def test_zero_batch_variance_is_fine_with_shrinkage():
    assert float(isoscore_star(torch.ones(10, 3), 0.5, torch.eye(3))) == pytest.approx(1.0)


# ---------------------------------------------------------------- streaming covariance


def test_accumulator_equals_torch_cov_in_chunks_with_merges_and_masks():
    g = torch.Generator().manual_seed(10)
    rows = torch.randn(3000, 24, dtype=torch.float64, generator=g) * 5 + 1e4  # large offset: no cancellation
    mask = torch.rand(3000, generator=g) > 0.3
    a, b = CovarianceAccumulator(24), CovarianceAccumulator(24)
    for start in range(0, 1500, 97):
        stop = min(start + 97, 1500)
        a.add(rows[start:stop], mask=mask[start:stop])
    b.add(rows[1500:].reshape(50, 30, 24), mask=mask[1500:].reshape(50, 30))
    merged = CovarianceAccumulator(24).merge(a).merge(b)
    expected = torch.cov(rows[mask].T)
    assert merged.count == int(mask.sum())
    torch.testing.assert_close(merged.covariance(), expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(merged.mean, rows[mask].mean(0), rtol=1e-12, atol=1e-9)


def test_accumulator_float32_rows_are_accurate():
    g = torch.Generator().manual_seed(11)
    rows = torch.randn(20_000, 16, generator=g) * 0.5 + 30.0
    acc = CovarianceAccumulator(16)
    for chunk in rows.split(1000):
        acc.add(chunk)
    torch.testing.assert_close(acc.covariance(), torch.cov(rows.double().T), rtol=1e-4, atol=1e-5)


def test_accumulator_state_round_trip_and_errors():
    acc = CovarianceAccumulator(3).add(torch.randn(10, 3))
    copy = CovarianceAccumulator.from_state_dict({"count": acc.count, "mean": acc.mean, "m2": acc.m2})
    torch.testing.assert_close(copy.covariance(), acc.covariance())
    with pytest.raises(ValueError, match="at least 2 rows"):
        CovarianceAccumulator(3).add(torch.randn(1, 3)).covariance()
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 3\)"):
        acc.add(torch.randn(5, 4))
    with pytest.raises(ValueError, match="mask shape"):
        acc.add(torch.randn(5, 3), mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN or inf"):
        acc.add(torch.tensor([[1.0, float("nan"), 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="cannot merge"):
        acc.merge(CovarianceAccumulator(4))


# ---------------------------------------------------------------- comparison measures


def test_average_cosine_similarity_equals_double_loop():
    g = torch.Generator().manual_seed(12)
    X = torch.randn(40, 7, dtype=torch.float64, generator=g) + 0.5
    unit = X / X.norm(dim=1, keepdim=True)
    pairs = [float(unit[i] @ unit[j]) for i in range(40) for j in range(40) if i != j]
    assert average_cosine_similarity(X) == pytest.approx(np.mean(pairs), abs=1e-12)
    with pytest.raises(ValueError, match="zero vectors"):
        average_cosine_similarity(torch.zeros(3, 2))


def test_partition_isotropy_matches_definition_and_is_mean_sensitive():
    g = torch.Generator().manual_seed(13)
    X = torch.randn(2000, 5, dtype=torch.float64, generator=g)
    _, vectors = torch.linalg.eigh(X.T @ X)
    z = torch.cat([torch.exp(X @ vectors).sum(0), torch.exp(-X @ vectors).sum(0)])  # both signs of each c
    assert partition_isotropy(X) == pytest.approx(float(z.min() / z.max()), rel=1e-10)
    assert 0.8 < partition_isotropy(X) <= 1.0
    assert partition_isotropy(X + 3.0) < 0.1  # a mean shift changes it; IsoScore is unmoved
    assert isoscore(X + 3.0) == pytest.approx(isoscore(X), abs=1e-10)


# ---------------------------------------------------------------- TwoNN


def test_twonn_linear_subspace():
    g = torch.Generator().manual_seed(14)
    latent = torch.rand(4000, 5, dtype=torch.float64, generator=g)
    embedding = random_orthogonal(30, g)[:5]
    X = latent @ embedding + 2.0
    assert twonn_dimension(X) == pytest.approx(5.0, rel=0.1)


def test_twonn_swiss_roll():
    rng = np.random.default_rng(15)
    t = 1.5 * np.pi * (1 + 2 * rng.random(4000))
    height = 21 * rng.random(4000)
    X = np.stack([t * np.cos(t), height, t * np.sin(t)], axis=1)
    assert twonn_dimension(X) == pytest.approx(2.0, rel=0.1)


def test_twonn_sphere_in_high_dimension():
    g = torch.Generator().manual_seed(16)
    points = torch.randn(4000, 4, dtype=torch.float64, generator=g)
    sphere = points / points.norm(dim=1, keepdim=True)  # S³, a 3-manifold
    X = sphere @ random_orthogonal(50, g)[:4]
    assert twonn_dimension(X, chunk_size=333) == pytest.approx(3.0, rel=0.1)


def test_twonn_duplicates_are_collapsed():
    g = torch.Generator().manual_seed(17)
    X = torch.rand(1500, 3, dtype=torch.float64, generator=g)
    with_duplicates = torch.cat([X, X[:400], X[:50]])
    assert twonn_dimension(with_duplicates) == pytest.approx(twonn_dimension(X), abs=1e-12)


def test_twonn_errors():
    with pytest.raises(ValueError, match="at least 3 distinct"):
        twonn_dimension(torch.ones(10, 4))
    with pytest.raises(ValueError, match="discard_fraction"):
        twonn_dimension(torch.randn(10, 4), discard_fraction=1.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        twonn_dimension(torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [1.0, 1.0]]))
