"""Benchmark: TwoNN intrinsic dimension, :func:`istar.core.twonn.twonn_dimension` vs scikit-dimension.

Run with ``python -m bench.twonn`` after ``pip install -e .[bench]`` (scikit-dimension is a
bench-only dependency). For each case both implementations get the same float64 NumPy array
and are timed side by side in one run, interleaved, each call from the input array to the
dimension; the first round warms up (numba compilation in skdim) and is dropped, and the
median of the remaining rounds is reported with the ratio istar / skdim and both estimates.

Cases: a 3-d swiss roll (a 2-d manifold), and points on a 10-d linear subspace with
isotropic noise in 20, 384 and 768 dimensions (the hidden sizes of MiniLM and BERT-base).
"""

from __future__ import annotations

import os

# Both libraries keep thread pools; left spinning after a call, one library's threads take the
# cores from the other's next call when the two are timed interleaved. Set before numpy and torch
# load (the OpenMP runtimes read it once).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402  (after the environment is set)
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from istar.core.twonn import KDTREE_MAX_DIM, twonn_dimension  # noqa: E402

CASES = [("swiss roll", 5_000, 3), ("10-d subspace + noise", 5_000, 20), ("10-d subspace + noise", 10_000, 384),
         ("10-d subspace + noise", 10_000, 768)]


def make_points(kind: str, n: int, d: int, seed: int = 0) -> np.ndarray:
    """(n, d) float64 points: a swiss roll for d = 3, else a random 10-d subspace plus noise of std 0.01."""
    rng = np.random.default_rng(seed)
    if kind == "swiss roll":
        t = 1.5 * math.pi * (1.0 + 2.0 * rng.random(n))
        return np.column_stack([t * np.cos(t), 21.0 * rng.random(n), t * np.sin(t)])
    latent = rng.standard_normal((n, 10))
    return latent @ rng.standard_normal((10, d)) + 0.01 * rng.standard_normal((n, d))


def run_istar(X: np.ndarray) -> float:
    return twonn_dimension(X)


def run_skdim(X: np.ndarray) -> float:
    from skdim.id import TwoNN

    return float(TwoNN(discard_fraction=0.1).fit(X).dimension_)


IMPLEMENTATIONS = {"istar": run_istar, "skdim": run_skdim}


def time_case(X: np.ndarray, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds and the estimate of each implementation on ``X``."""
    times: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
    values: dict[str, float] = {}
    for repeat in range(repeats + 1):  # the first round warms up and is dropped
        for name, run in IMPLEMENTATIONS.items():
            start = time.perf_counter()
            values[name] = run(X)
            if repeat:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, values


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import skdim

    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), scikit-dimension {skdim.__version__}, "
          f"k-d tree for d ≤ {KDTREE_MAX_DIM}, median of {args.repeats} rounds, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}\n")
    print("| data | n × d | istar (s) | skdim (s) | istar / skdim | istar ID | skdim ID |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, n, d in CASES:
        seconds, values = time_case(make_points(kind, n, d), args.repeats)
        print(f"| {kind} | {n:,} × {d} | {seconds['istar']:.3f} | {seconds['skdim']:.3f} | "
              f"{seconds['istar'] / seconds['skdim']:.2f} | {values['istar']:.6f} | {values['skdim']:.6f} |", flush=True)
    print("\nTarget: istar / skdim ≤ 1 on every case.")


if __name__ == "__main__":
    main()
