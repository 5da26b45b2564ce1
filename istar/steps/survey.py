"""The survey step: isotropy of a pretrained model's static embeddings and of every layer.

``istar survey`` measures one model at one revision (Machina & Mercer, NAACL 2024, asked
the same questions of Pythia checkpoints; IsoScore is docs/method.md §1, IsoScore* §2):

static embeddings — the input matrix W_in (V, d) and a causal LM's output matrix W_out (V, d)
(a single shared matrix, OPT's or Falcon's, is reported once as ``output``, as Machina & Mercer
label it: :attr:`istar.models.pretrained.LoadedModel.static_matrices`), each raw and mean-centred:
    IsoScore (a covariance measure, so centring does not change it: reported once),
    the partition isotropy I(W) of Mu et al. twice — over both signs of each eigenvector
    (``partition_isotropy_both_signs``, :func:`istar.core.baseline_measures.partition_isotropy`) and with
    the one sign the solver returns, as Machina & Mercer's code computes it
    (``partition_isotropy_solver_signs``, :func:`solver_eigenvectors`) —, the average cosine
    similarity of all pairs; and a 2-D projection of a seeded sample of rows onto the top two
    right singular vectors (the projection galleries);

contextual representations — the non-padding tokens of a text sample, every hidden state
l = 0 (embeddings) … L, and for models with a final norm the last layer *before* it
(``pre_final_norm``; hidden state L is after it):
    IsoScore, IsoScore*(ζ) with Σ_S of the same layer estimated from a *disjoint* part of
    the sample, the average cosine similarity, the share of the total variance in the
    top-1 and top-10 coordinates and in the first principal component, the number of
    outlier coordinates (variance > OUTLIER_FACTOR × the mean coordinate variance), the
    mean norm, the effective rank of the covariance spectrum and the TwoNN intrinsic
    dimension of the first ``twonn_tokens`` measured tokens; and the spread of the final
    norm's gain vector.

Memory is O(L·d² + L·twonn_tokens·d): each hidden state is folded into its own streaming
accumulators batch by batch (:class:`~istar.core.covariance.CovarianceAccumulator`); only the TwoNN
sample of token vectors is kept (float32). The
result, with its provenance (source, revision, resolved commit, tokens, layers, cost),
is one JSON file. Loading is in :mod:`istar.models.pretrained`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from pathlib import Path

import torch

from istar import __version__
from istar.config.specs import SurveySpec
from istar.core.baseline_measures import (
    FP32_EXP_LIMIT,
    average_cosine_similarity,
    cosine_from_unit_sum,
    partition_isotropy,
    partition_isotropy_one_sign,
)
from istar.core.covariance import CovarianceAccumulator
from istar.core.isotropy import isoscore_from_eigenvalues, isoscore_star_from_covariance
from istar.core.twonn import twonn_dimension
from istar.io import artifacts
from istar.io.text import read_utf8
from istar.models.hidden_states import hidden_state_pass

__all__ = ["OUTLIER_FACTOR", "solver_eigenvectors", "effective_rank", "static_measures", "projection",
           "layer_measures", "read_texts", "survey_model", "run_survey"]

OUTLIER_FACTOR = 5.0
"""A coordinate is an outlier dimension when its variance exceeds this multiple of the mean coordinate variance."""

# ------------------------------------------------------------------------------ measures


def _spectrum(cov: torch.Tensor) -> torch.Tensor:
    """Eigenvalues (d,) of a covariance, descending, negatives from rounding clipped to 0."""
    return torch.linalg.eigvalsh(cov.to(torch.float64)).flip(0).clamp_min(0.0)


def _variance_shares(cov: torch.Tensor, eigenvalues: torch.Tensor) -> dict:
    """Where the variance sits: top coordinates, the outlier rule, the first principal component."""
    variances = torch.diagonal(cov).to(torch.float64)
    total = variances.sum()
    ordered = variances.sort(descending=True).values
    return {
        "top1_dim_variance_share": float(ordered[0] / total),
        "top10_dim_variance_share": float(ordered[:10].sum() / total),
        "outlier_dims": int((variances > OUTLIER_FACTOR * variances.mean()).sum()),
        "top1_pc_variance_share": float(eigenvalues[0] / eigenvalues.sum()),
    }


def effective_rank(eigenvalues: torch.Tensor) -> float:
    """Effective rank exp(H(p)) of a spectrum λ (d,) ≥ 0, p = λ / Σλ, H the Shannon entropy (nats).

    Roy & Vetterli (2007): 1 when one direction holds all the variance, d when all hold the
    same share. (The participation ratio (Σλ)² / Σλ² is not reported: it is 1 + (d − 1) ×
    IsoScore*(ζ = 0), already in the profile.)
    """
    p = eigenvalues.to(torch.float64) / eigenvalues.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * torch.log(p)).sum()))


def solver_eigenvectors(W: torch.Tensor) -> torch.Tensor:
    """Eigenvectors (d, d), as columns, of WᵀW the way Machina & Mercer's script obtains them.

    Their code multiplies the float32 weights on the CPU (``torch.mm(Wᵀ, W)``) and takes
    ``torch.linalg.eigh``'s columns with the signs it returns. Which sign comes back is a
    property of the solver, its precision and its device, not of W, so it is reproduced
    here as they ran it (float32, CPU); the result is float64 for the sums that follow.
    """
    W32 = W.detach().to("cpu", torch.float32)
    return torch.linalg.eigh(W32.T @ W32).eigenvectors.to(torch.float64)


def _partition_measures(W: torch.Tensor, suffix: str) -> dict:
    """Both I(W) definitions of W (V, d) float64, and the largest exponent of the one-sign recipe."""
    solver, max_exponent = partition_isotropy_one_sign(W, solver_eigenvectors(W).to(W.device))
    return {f"partition_isotropy_both_signs{suffix}": partition_isotropy(W),
            f"partition_isotropy_solver_signs{suffix}": solver,
            f"solver_signs_max_exponent{suffix}": max_exponent,
            f"solver_signs_fp32_overflow{suffix}": max_exponent > FP32_EXP_LIMIT}


def static_measures(W: torch.Tensor) -> dict:
    """Isotropy of an embedding matrix W (V, d), rows = vocabulary entries (every row, padding included).

    Returns ``isoscore`` (of the rows' covariance, the same raw or centred); raw, and with
    suffix ``_centred`` after subtracting the mean row: ``partition_isotropy_both_signs``
    (min/max over ±c), ``partition_isotropy_solver_signs`` (the NAACL paper's recipe, one sign
    per eigenvector as returned), ``solver_signs_max_exponent`` (max cᵀw of that recipe) and
    ``solver_signs_fp32_overflow`` (whether a plain float32 exp of it is inf, as in the
    authors' code), ``average_cosine``; ``mean_norm``, ``zero_rows`` (all-zero rows, left out
    of the cosine measures), plus the variance shares of :func:`layer_measures`. Float64
    throughout.
    """
    W = W.detach().to(torch.float64)
    # Rows of zeros (a padding embedding initialised to zero, unused tokens) have no direction:
    # the cosine measures leave them out and say how many there were.
    nonzero = torch.linalg.vector_norm(W, dim=1) > 0
    accumulator = CovarianceAccumulator(W.shape[1], device=W.device).add(W)
    cov = accumulator.covariance()
    eigenvalues = _spectrum(cov)
    centred = W - accumulator.mean
    return {
        "rows": int(W.shape[0]), "dim": int(W.shape[1]),
        "isoscore": isoscore_from_eigenvalues(eigenvalues),
        **_partition_measures(W, ""),
        **_partition_measures(centred, "_centred"),
        "average_cosine": average_cosine_similarity(W[nonzero]),
        "average_cosine_centred": average_cosine_similarity(centred[torch.linalg.vector_norm(centred, dim=1) > 0]),
        "zero_rows": int((~nonzero).sum()),
        "mean_norm": float(torch.linalg.vector_norm(W, dim=1).mean()),
        **_variance_shares(cov, eigenvalues),
    }


def projection(W: torch.Tensor, rows: torch.Tensor) -> dict:
    """2-D SVD projection of W (V, d) float64: the ``rows`` (k,) onto its top two right singular vectors.

    Raw: the singular vectors of W (eigenvectors of WᵀW), so a common offset of the rows
    shows as a cloud away from the origin; centred: those of W − mean, coordinates of the
    centred rows. A singular vector's sign is arbitrary: each axis is oriented so that the
    sum of the cubed coordinates of all V rows is ≥ 0 (the mean is 0 after centring, so it
    cannot orient those axes; with an offset the cubes follow it). Returns ``{"raw": {"x", "y"}, "centred": {...}}``
    (lists of k floats, 5 significant digits).
    """
    result = {}
    for name, matrix in (("raw", W), ("centred", W - W.mean(dim=0))):
        axes = torch.linalg.eigh(matrix.T @ matrix).eigenvectors[:, [-1, -2]]  # (d, 2), largest first
        axes = axes * torch.where(((matrix @ axes) ** 3).sum(dim=0) < 0, -1.0, 1.0)
        coordinates = (matrix[rows] @ axes).cpu()
        result[name] = {axis: [float(f"{v:.5g}") for v in coordinates[:, i].tolist()]
                        for i, axis in enumerate("xy")}
    return result


class LayerStats:
    """Streaming statistics of one hidden state: covariance, Σ x/‖x‖ and Σ ‖x‖ (O(d²) memory),
    and the first ``keep`` token vectors as they came (float32, on the CPU) for TwoNN."""

    def __init__(self, dim: int, device, keep: int):
        self.covariance = CovarianceAccumulator(dim, device=device)
        self.unit_sum = torch.zeros(dim, dtype=torch.float64, device=device)
        self.norm_sum = 0.0
        self.keep = keep
        self.sample: list[torch.Tensor] = []

    @torch.no_grad()
    def add(self, rows: torch.Tensor) -> None:
        """Fold in token vectors (k, d) (padding already removed)."""
        kept = min(self.covariance.count, self.keep)  # the sample is the first tokens added
        if kept < self.keep:
            self.sample.append(rows[:self.keep - kept].detach().to("cpu", torch.float32))
        self.covariance.add(rows)
        rows = rows.to(torch.float64)
        norms = torch.linalg.vector_norm(rows, dim=1)
        self.unit_sum += (rows / norms.clamp_min(1e-300)[:, None]).sum(dim=0)
        self.norm_sum += float(norms.sum())


def layer_measures(stats: LayerStats, sigma_s: torch.Tensor | None, zeta: float, twonn_discard: float) -> dict:
    """The contextual measures of one hidden state from its statistics.

    ``isoscore_star`` is IsoScore*(Σ_X, ζ, Σ_S) (docs/method.md §2) with Σ_S from the
    disjoint sample (None: not computed). ``average_cosine`` is exact over all pairs of
    the N tokens: (‖Σ x̂‖² − N) / (N(N − 1)). ``effective_rank`` is that of the covariance
    spectrum (:func:`effective_rank`); ``twonn`` the TwoNN intrinsic dimension (docs/method.md
    §5) of the first ``twonn_tokens`` measured token vectors (None when undefined or twonn_tokens is 0).
    """
    n = stats.covariance.count
    cov = stats.covariance.covariance()
    eigenvalues = _spectrum(cov)
    twonn = None
    if stats.sample:
        with contextlib.suppress(ValueError):  # undefined: fewer than 3 distinct vectors…
            twonn = twonn_dimension(torch.cat(stats.sample), discard_fraction=twonn_discard)
    return {
        "tokens": n,
        "isoscore": isoscore_from_eigenvalues(eigenvalues),
        "isoscore_star": float(isoscore_star_from_covariance(cov, zeta, sigma_s)) if sigma_s is not None else None,
        "average_cosine": cosine_from_unit_sum(stats.unit_sum, n),
        "mean_norm": stats.norm_sum / n,
        "effective_rank": effective_rank(eigenvalues),
        "twonn": twonn,
        "twonn_tokens": min(n, stats.keep),
        **_variance_shares(cov, eigenvalues),
    }


def gain_spread(weight: torch.Tensor) -> dict:
    """Spread of a norm's gain vector γ (d,): mean, std, min, max, std/|mean|."""
    gain = weight.detach().to(torch.float64).flatten()
    mean, std = float(gain.mean()), float(gain.std())
    return {"mean": mean, "std": std, "min": float(gain.min()), "max": float(gain.max()),
            "coefficient_of_variation": std / abs(mean) if mean else None}


# ------------------------------------------------------------------------------ text


def read_texts(source: str, split: str = "validation") -> list[str]:
    """Documents of a text source: a prepared task folder's split, or a text file's non-empty lines.

    Task rows become ``text_a [+ " " + text_b]`` (``question + " " + context`` for QA).
    """
    path = Path(source)
    if path.is_file():
        texts = [line.strip() for line in read_utf8(path).splitlines() if line.strip()]
    elif path.is_dir():
        from istar.data import read_split

        frame = read_split(path, split)
        if "question" in frame.columns:
            texts = (frame["question"] + " " + frame["context"]).tolist()
        else:
            texts = [a if not isinstance(b, str) or not b else f"{a} {b}"
                     for a, b in zip(frame["text_a"], frame.get("text_b", [None] * len(frame)))]
    else:
        raise ValueError(f"text source {source}: neither a text file nor a prepared task folder "
                         "(make one with `istar prepare-data`)")
    if not texts:
        raise ValueError(f"text source {source} holds no text")
    return texts


def _budget_mask(mask: torch.Tensor, remaining: int) -> torch.Tensor:
    """``mask`` (B, T) with the non-padding tokens after the first ``remaining`` (reading order) dropped."""
    return mask & (torch.cumsum(mask.flatten().long(), 0) <= remaining).reshape(mask.shape)


# ------------------------------------------------------------------------------ the pass


@torch.no_grad()
def collect(loaded, texts: list[str], spec: SurveySpec) -> tuple[list[LayerStats], list[CovarianceAccumulator], dict]:
    """Stream the text through the model: statistics of the measured and the Σ_S samples.

    The first ``sigma_tokens`` non-padding tokens (document order fixed by ``seed``) feed
    the Σ_S accumulators, the next ``tokens`` the measured statistics; a document whose
    tokens straddle the boundary is counted in both (its tokens are split, not shared).
    Index ``L + 1`` of both lists is the last layer before the final norm, if there is one.
    """
    model, tokenizer, device = loaded.backbone, loaded.tokenizer, loaded.device
    captured = {}
    hook = loaded.final_norm.register_forward_hook(lambda module, args, out: captured.update(pre=args[0])) \
        if loaded.final_norm is not None else None
    pre_norm = (lambda: [captured.pop("pre")]) if hook is not None else None
    measured: list[LayerStats] = []
    sigma: list[CovarianceAccumulator] = []
    need = {"sigma": spec.sigma_tokens, "measured": spec.tokens}
    started, forward_seconds, documents = time.perf_counter(), 0.0, 0
    shuffled = list(texts)
    random.Random(spec.seed).shuffle(shuffled)  # the documents in an order fixed by the seed, batch_size at a time
    encoded = (tokenizer(shuffled[start:start + spec.batch_size], padding=True, truncation=True,
                         max_length=spec.max_length, return_tensors="pt")
               for start in range(0, len(shuffled), spec.batch_size))
    try:
        for batch in hidden_state_pass(model, encoded, device=device, extra_states=pre_norm):
            documents += batch.mask.shape[0]
            forward_seconds += batch.seconds
            if not measured:
                dim = batch.states[0].shape[-1]
                measured = [LayerStats(dim, device, spec.twonn_tokens) for _ in batch.states]
                sigma = [CovarianceAccumulator(dim, device=device) for _ in batch.states]
            to_sigma = _budget_mask(batch.mask, need["sigma"])
            to_measure = _budget_mask(batch.mask & ~to_sigma, need["measured"])
            for stats, accumulator, hidden in zip(measured, sigma, batch.states):
                if to_sigma.any():
                    accumulator.add(hidden, mask=to_sigma)
                if to_measure.any():
                    stats.add(hidden[to_measure])
            need["sigma"] -= int(to_sigma.sum())
            need["measured"] -= int(to_measure.sum())
            if need["measured"] <= 0:
                break
    finally:
        if hook is not None:
            hook.remove()
    if not measured or measured[0].covariance.count < 2:
        raise ValueError(f"the text sample gave fewer than 2 tokens to measure after {spec.sigma_tokens} for Σ_S: "
                         "use a larger text source or lower sigma_tokens")
    cost = {"documents": documents, "seconds": round(time.perf_counter() - started, 3),
            "forward_seconds": round(forward_seconds, 3)}
    return measured, sigma, cost


def survey_model(spec: SurveySpec) -> dict:
    """Load the model, measure it, return the profile (see the module docstring)."""
    from istar.models.pretrained import load_for_survey, parameter_count

    started = time.perf_counter()
    if spec.device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    loaded = load_for_survey(spec)
    texts = read_texts(spec.text, spec.split)
    static, projections = {}, {}
    for which, W in loaded.static_matrices.items():
        static[which] = static_measures(W)
        # a seeded sample of projection_rows row indices (all rows of a smaller vocabulary), ascending
        rows = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(spec.seed))[:spec.projection_rows]
        rows = rows.sort().values
        projections[which] = {"rows": int(W.shape[0]), "sampled_rows": len(rows), "seed": spec.seed,
                              **projection(W.detach().to(torch.float64), rows.to(W.device))}
    measured, sigma, cost = collect(loaded, texts, spec)
    # index L + 1, where there is one, is the last layer before the final norm
    layers = [{"layer": "pre_final_norm" if index == loaded.num_layers + 1 else index,
               **layer_measures(stats, accumulator.covariance() if accumulator.count >= 2 else None, spec.zeta,
                                spec.twonn_discard)}
              for index, (stats, accumulator) in enumerate(zip(measured, sigma))]
    tokens, sigma_tokens = measured[0].covariance.count, sigma[0].count
    # every token the pass read: the measured ones and those of Σ_S
    cost.update(tokens_per_second=round((tokens + sigma_tokens) / cost["seconds"], 1) if cost["seconds"] else None,
                total_seconds=round(time.perf_counter() - started, 3), **_peak_memory(loaded.device))
    return {
        "spec": dataclasses.asdict(spec),
        "provenance": {**loaded.provenance, "tokens": tokens, "sigma_tokens": sigma_tokens,
                       "num_layers": loaded.num_layers, "hidden_size": loaded.hidden_size, "parameters": parameter_count(loaded.model),
                       "tied_embeddings": loaded.output_embeddings is None and loaded.has_output_matrix,
                       "final_norm": loaded.final_norm_name, "outlier_rule": f"variance > {OUTLIER_FACTOR:g} × mean",
                       "istar_version": __version__, "torch_version": torch.__version__},
        "cost": cost,
        "static": static,
        "projections": projections,
        "layers": layers,
        "final_norm_gain": None if (gain := getattr(loaded.final_norm, "weight", None)) is None else gain_spread(gain),
    }


def _peak_memory(device: torch.device) -> dict:
    """Peak memory of this process: GPU (torch's allocator) or CPU (max resident set size), MiB."""
    if device.type == "cuda":
        return {"peak_memory_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1), "peak_memory_of": "cuda"}
    import resource

    return {"peak_memory_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "peak_memory_of": "cpu (max RSS of the process)"}


def run_survey(spec: SurveySpec) -> dict:
    """The survey step: measure and write ``spec.out`` (JSON) atomically. Returns the profile."""
    result = survey_model(spec)
    artifacts.write_json(spec.out, result)
    provenance, cost = result["provenance"], result["cost"]
    print(f"profile of {spec.model}" + (f"@{spec.revision}" if spec.revision else "")
          + f": {provenance['num_layers']} layers, {provenance['tokens']:,} tokens, "
          f"{cost['tokens_per_second']} tokens/s, peak {cost['peak_memory_mib']} MiB -> {spec.out}")
    if provenance["tokens"] < spec.tokens or provenance["sigma_tokens"] < spec.sigma_tokens:
        print(f"note: the text gave {provenance['sigma_tokens']:,} of {spec.sigma_tokens:,} Σ_S tokens and "
              f"{provenance['tokens']:,} of {spec.tokens:,} measured tokens")
    return result


# ------------------------------------------------------------------------------ CLI
