"""Benchmark: IsoScore* value + gradient, closed form vs eigenvalues/SVD vs the XᵀX floor.

Run with ``make bench`` (or ``python -m bench.isoscore_star``). For each shape, the three
methods are timed side by side in one run, interleaved, and the median of the repeats is
reported with the ratio to the floor:

- closed form: :func:`istar.core.isotropy.isoscore_star` (value and gradient with respect to X),
  whose hand-written backward costs one (n, d)×(d, d) product;
- closed form, plain autograd: the same formula on the sample covariance, autograd through it;
- eigh / svd: the same score through the eigenvalues (``eigvalsh``) or singular values
  (``svdvals``, as the public reference code does) of Σ_ζ, autograd all the way;
- floor: one product XᵀX forward and backward, which every implementation pays.

``--accuracy``: the closed form's score and gradient under autocast (its product X_cᵀX_c in the
autocast dtype) and in float32, against the float64 reference (:func:`product_accuracy`).

``bench.gpu_check`` reuses :func:`time_methods` on a GPU, in fp32 and under fp16 autocast;
``bench.gpu_pack`` reuses both.
"""

from __future__ import annotations

import argparse
import contextlib
import math

import torch

from istar.core.isotropy import isoscore_star, isoscore_star_from_covariance

from .measure import median_times

SHAPES = [(12_288, 384), (24_576, 768)]  # MiniLM-L6: 6 layers × 32 × 64 tokens; BERT-base: 12 × 32 × 64
ZETA = 0.2


def score_from_spectrum(eigenvalues: torch.Tensor) -> torch.Tensor:
    """Steps 6–9 of Algorithm 1 on a spectrum, differentiable (for the eig/SVD baselines)."""
    d = eigenvalues.numel()
    normalised = math.sqrt(d) * eigenvalues / torch.linalg.vector_norm(eigenvalues)
    delta = torch.linalg.vector_norm(normalised - 1) / math.sqrt(2 * (d - math.sqrt(d)))
    phi = (d - delta**2 * (d - math.sqrt(d))) ** 2 / d**2
    return (d * phi - 1) / (d - 1)


def sample_covariance(X: torch.Tensor) -> torch.Tensor:
    # Scaled before the product, so the sums stay near the variances: under fp16 autocast
    # an unscaled XᵀX of 24,576 rows would overflow fp16's range (65,504), as torch.cov does.
    Xs = (X - X.mean(dim=0)) / math.sqrt(X.shape[0] - 1)
    return Xs.T @ Xs


def shrunk_covariance(X: torch.Tensor, sigma_s: torch.Tensor) -> torch.Tensor:
    return (1 - ZETA) * sample_covariance(X) + ZETA * sigma_s


def closed_form(X, sigma_s):
    score = isoscore_star(X, ZETA, sigma_s)
    score.backward()
    return score


def closed_form_autograd(X, sigma_s):
    score = isoscore_star_from_covariance(sample_covariance(X), ZETA, sigma_s)
    score.backward()
    return score


def through_eigh(X, sigma_s):
    score = score_from_spectrum(torch.linalg.eigvalsh(shrunk_covariance(X, sigma_s)))
    score.backward()
    return score


def through_svd(X, sigma_s):
    score = score_from_spectrum(torch.linalg.svdvals(shrunk_covariance(X, sigma_s)))
    score.backward()
    return score


def closed_form_float32(X, sigma_s):
    """The closed form with autocast off: its product in float32, as it ran under autocast before."""
    with torch.autocast(X.device.type, enabled=False):
        return closed_form(X, sigma_s)


def floor(X, sigma_s):
    (X.T @ X).sum().backward()
    return None


METHODS = {
    "closed form": closed_form,
    "closed form, plain autograd": closed_form_autograd,
    "eigh": through_eigh,
    "svd": through_svd,
    "floor XᵀX": floor,
}
# timed on request only (bench.gpu_pack): the product as it ran under autocast before it ran in the autocast dtype
BEFORE = {"closed form, float32 product": closed_form_float32}


def time_methods(n: int, d: int, repeats: int, device: torch.device | str = "cpu",
                 autocast: torch.dtype | None = None, names=tuple(METHODS)) -> tuple[dict[str, float], dict[str, float]]:
    """Median time (s) of value + gradient of each method on an (n, d) float32 input, and its score.

    ``autocast``: run every method under ``torch.autocast`` with this dtype (the input stays
    float32, as hidden states coming out of a LayerNorm do). Returns (medians, scores); the
    floor has no score. ``names``: the methods to time, of :data:`METHODS` and :data:`BEFORE`.
    """
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(n, d, generator=g) * torch.linspace(0.1, 3.0, d)).to(device).requires_grad_()
    sigma_s = torch.cov(torch.randn(4 * d, d, generator=g).T).to(device=device, dtype=torch.float32)
    sigma_s64 = sigma_s.double()
    context = (lambda: torch.autocast(device.type, dtype=autocast)) if autocast is not None else contextlib.nullcontext

    methods = {**METHODS, **BEFORE}

    def call(name):
        X.grad = None
        with context():
            return methods[name](X, sigma_s64 if name.startswith("closed form") else sigma_s)

    medians = median_times({name: (lambda name=name: call(name)) for name in names}, repeats, device)
    scores = {name: float(score.detach()) for name in names if (score := call(name)) is not None}
    return medians, scores


def sample_points(n: int, d: int, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, Σ_S): X with unequal variances (0.1–3.0), an offset, and one outlying dimension 20 × the
    others (as BERT-like encoders have), float32; Σ_S from other points, float64."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g) * torch.linspace(0.1, 3.0, d) + torch.randn(d, generator=g)
    X[:, 0] *= 20.0
    sigma_s = torch.cov(torch.randn(4 * d, d, generator=g).T).double()
    return X.to(device), sigma_s.to(device)


def product_accuracy(X: torch.Tensor, sigma_s: torch.Tensor, dtype: torch.dtype | None, zeta: float = ZETA) -> dict:
    """The closed form's score and gradient on the float32 points ``X`` under autocast in ``dtype`` (None: no
    autocast, the float32 product), against float64 throughout: absolute score error, and the gradient's
    relative error ‖g − g₆₄‖ / ‖g₆₄‖."""
    X64 = X.detach().double().requires_grad_()
    reference = isoscore_star(X64, zeta, sigma_s)
    reference.backward()
    X = X.detach().clone().requires_grad_()
    context = torch.autocast(X.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with context:
        score = isoscore_star(X, zeta, sigma_s)
    score.backward()
    gradient_error = torch.linalg.vector_norm(X.grad.double() - X64.grad) / torch.linalg.vector_norm(X64.grad)
    reference, score = float(reference.detach()), float(score.detach())
    return {"score": reference, "score_error": abs(score - reference),
            "gradient_relative_error": float(gradient_error)}


def accuracy_table(shapes, device: torch.device | str, dtypes) -> list[dict]:
    """:func:`product_accuracy` of each shape, ζ ∈ {0, 0.2} and dtype (None = float32), as table rows."""
    rows = []
    for n, d in shapes:
        X, sigma_s = sample_points(n, d, device)
        for zeta in (0.0, ZETA):
            for dtype in dtypes:
                rows.append({"n": n, "d": d, "zeta": zeta, "product": str(dtype or torch.float32).removeprefix("torch."),
                             **product_accuracy(X, sigma_s, dtype, zeta)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--accuracy", action="store_true", help="the closed form's error against float64 instead")
    args = parser.parse_args(argv)
    if args.accuracy:
        shapes = [(512, 32), (256, 768), *SHAPES]
        print("| n × d | ζ | product | IsoScore* (float64) | score error | gradient relative error |")
        print("| --- | ---: | --- | ---: | ---: | ---: |")
        for r in accuracy_table(shapes, "cpu", (None, torch.bfloat16, torch.float16)):
            print(f"| {r['n']:,} × {r['d']} | {r['zeta']} | {r['product']} | {r['score']:.5f} | {r['score_error']:.1e} "
                  f"| {r['gradient_relative_error']:.1e} |")
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 input, zeta = {ZETA}\n")
    print("| n × d | method | median time (ms) | ratio to floor |")
    print("| --- | --- | ---: | ---: |")
    for n, d in SHAPES:
        medians, _ = time_methods(n, d, args.repeats)
        base = medians["floor XᵀX"]
        for name, seconds in medians.items():
            print(f"| {n:,} × {d} | {name} | {seconds * 1e3:.1f} | {seconds / base:.2f} |")
    print("\nTarget: closed form ≤ 1.25 × floor.")


if __name__ == "__main__":
    main()
