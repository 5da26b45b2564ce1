"""Benchmark: IsoScore* value + gradient, closed form vs eigenvalues/SVD vs the XᵀX floor.

Run with ``make bench`` (or ``python -m bench.isoscore_star``). For each shape, the three
methods are timed side by side in one run, interleaved, and the median of the repeats is
reported with the ratio to the floor:

- closed form: :func:`istar.isotropy.isoscore_star` (value and gradient with respect to X),
  whose hand-written backward costs one (n, d)×(d, d) product;
- closed form, plain autograd: the same formula on ``torch.cov(X.T)``, autograd through it;
- eigh / svd: the same score through the eigenvalues (``eigvalsh``) or singular values
  (``svdvals``, as the public reference code does) of Σ_ζ, autograd all the way;
- floor: one product XᵀX forward and backward, which every implementation pays.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from istar.isotropy import isoscore_star, isoscore_star_from_covariance

SHAPES = [(12_288, 384), (24_576, 768)]  # MiniLM-L6: 6 layers × 32 × 64 tokens; BERT-base: 12 × 32 × 64
ZETA = 0.2


def score_from_spectrum(eigenvalues: torch.Tensor) -> torch.Tensor:
    """Steps 6–9 of Algorithm 1 on a spectrum, differentiable (for the eig/SVD baselines)."""
    d = eigenvalues.numel()
    normalised = math.sqrt(d) * eigenvalues / torch.linalg.vector_norm(eigenvalues)
    delta = torch.linalg.vector_norm(normalised - 1) / math.sqrt(2 * (d - math.sqrt(d)))
    phi = (d - delta**2 * (d - math.sqrt(d))) ** 2 / d**2
    return (d * phi - 1) / (d - 1)


def shrunk_covariance(X: torch.Tensor, sigma_s: torch.Tensor) -> torch.Tensor:
    Xc = X - X.mean(dim=0)
    return (1 - ZETA) * (Xc.T @ Xc) / (X.shape[0] - 1) + ZETA * sigma_s


def closed_form(X, sigma_s):
    isoscore_star(X, ZETA, sigma_s).backward()


def closed_form_autograd(X, sigma_s):
    isoscore_star_from_covariance(torch.cov(X.T), ZETA, sigma_s).backward()


def through_eigh(X, sigma_s):
    score_from_spectrum(torch.linalg.eigvalsh(shrunk_covariance(X, sigma_s))).backward()


def through_svd(X, sigma_s):
    score_from_spectrum(torch.linalg.svdvals(shrunk_covariance(X, sigma_s))).backward()


def floor(X, sigma_s):
    (X.T @ X).sum().backward()


METHODS = {
    "closed form": closed_form,
    "closed form, plain autograd": closed_form_autograd,
    "eigh": through_eigh,
    "svd": through_svd,
    "floor XᵀX": floor,
}


def time_methods(n: int, d: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(n, d, generator=g) * torch.linspace(0.1, 3.0, d)).requires_grad_()
    sigma_s = torch.cov(torch.randn(4 * d, d, generator=g).T).to(torch.float32)
    sigma_s64 = sigma_s.double()
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    for repeat in range(repeats + 1):  # the first round warms up and is dropped
        for name, method in METHODS.items():
            X.grad = None
            start = time.perf_counter()
            method(X, sigma_s64 if name.startswith("closed form") else sigma_s)
            elapsed = time.perf_counter() - start
            if repeat:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 input, zeta = {ZETA}\n")
    print("| n × d | method | median time (ms) | ratio to floor |")
    print("| --- | --- | ---: | ---: |")
    for n, d in SHAPES:
        medians = time_methods(n, d, args.repeats)
        base = medians["floor XᵀX"]
        for name, seconds in medians.items():
            print(f"| {n:,} × {d} | {name} | {seconds * 1e3:.1f} | {seconds / base:.2f} |")
    print("\nTarget: closed form ≤ 1.25 × floor.")


if __name__ == "__main__":
    main()
