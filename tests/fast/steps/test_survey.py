"""istar survey: the measures against independent computations, on real models (MiniLM, a GGUF decoder)."""

import argparse
import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from survey_helpers import SENTENCES, minilm_profile, numpy_partition, text_file

from istar.cli import main
from istar.config.specs import SpecError, SurveySpec, spec_from_cli
from istar.core.baseline_measures import FP32_EXP_LIMIT, partition_isotropy, partition_isotropy_one_sign
from istar.core.isotropy import isoscore
from istar.core.twonn import twonn_dimension
from istar.steps.survey import effective_rank, projection, read_texts, static_measures


def numpy_one_sign(W: np.ndarray, vectors: np.ndarray) -> float:
    """min/max of Z(c) over the given columns only, with a plain exp (W must be small enough for it)."""
    z = np.exp(W @ vectors).sum(axis=0)
    return float(z.min() / z.max())


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


def test_the_two_partition_definitions_differ_and_only_one_depends_on_signs():
    """A hand-built matrix with a mean offset: one-sign I(W) > both-signs I(W), each against NumPy;
    flipping eigenvector signs moves the one-sign value and never the sign-invariant one."""
    rng = np.random.default_rng(7)
    W = rng.normal(size=(400, 5)) * np.array([1.5, 1.0, 0.7, 0.4, 0.2]) + np.array([0.8, -0.5, 0.3, 0.0, 0.1])
    _, vectors = np.linalg.eigh(W.T @ W)
    one_sign, max_exponent = partition_isotropy_one_sign(torch.from_numpy(W), torch.from_numpy(vectors))
    assert one_sign == pytest.approx(numpy_one_sign(W, vectors), rel=1e-12)
    assert max_exponent == pytest.approx((W @ vectors).max(), rel=1e-12)
    both = partition_isotropy(torch.from_numpy(W))
    assert both == pytest.approx(numpy_partition(W), rel=1e-12)
    assert both < one_sign - 0.05, "the data must separate the two definitions"
    seen = set()
    for pattern in range(2 ** 5):
        signs = np.array([-1.0 if pattern >> j & 1 else 1.0 for j in range(5)])
        flipped = vectors * signs
        value = partition_isotropy_one_sign(torch.from_numpy(W), torch.from_numpy(flipped))[0]
        assert value == pytest.approx(numpy_one_sign(W, flipped), rel=1e-12)
        assert value >= both - 1e-12
        seen.add(round(value, 9))
        # the invariant one over these columns and their negatives: the same for every pattern
        z = np.exp(np.concatenate([W @ flipped, -(W @ flipped)], axis=1)).sum(axis=0)
        assert z.min() / z.max() == pytest.approx(both, rel=1e-12)
    assert len(seen) > 8  # the one-sign value takes many values over the sign patterns
    assert min(seen) == pytest.approx(both, rel=1e-9) or min(seen) > both  # never below the invariant one


def test_log_space_survives_where_a_float32_exp_overflows():
    """Scaled so that cᵀw reaches ~300: a plain fp32 exp is inf, the log-space ratio is finite and right."""
    rng = np.random.default_rng(1)
    W = rng.normal(size=(300, 4)) * 60 + 30
    measures = static_measures(torch.from_numpy(W))
    assert measures["solver_signs_fp32_overflow"] and measures["solver_signs_max_exponent"] > FP32_EXP_LIMIT
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(np.float32(measures["solver_signs_max_exponent"])))
    assert 0 < measures["partition_isotropy_both_signs"] == pytest.approx(numpy_partition(W), rel=1e-8)
    from istar.steps.survey import solver_eigenvectors

    # the directions the profile takes (the solver's signs), the sums in NumPy, shifted by the largest exponent
    exponents = W @ solver_eigenvectors(torch.from_numpy(W)).numpy()
    shifted = np.exp(exponents - exponents.max()).sum(axis=0)
    assert measures["partition_isotropy_solver_signs"] == pytest.approx(shifted.min() / shifted.max(), rel=1e-9)
    assert measures["solver_signs_max_exponent"] == pytest.approx(exponents.max(), rel=1e-12)


def test_effective_rank_and_projection_against_numpy():
    spectrum = torch.tensor([4.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    p = np.array([4, 2, 1, 1]) / 8
    assert effective_rank(spectrum) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-12)
    assert effective_rank(torch.ones(7, dtype=torch.float64)) == pytest.approx(7.0)
    rng = np.random.default_rng(2)
    W = rng.normal(size=(200, 6)) * np.array([3, 2, 1, 1, 1, 1]) + 2.0
    rows = torch.tensor([0, 5, 17, 150])
    result = projection(torch.from_numpy(W), rows)
    for name, matrix in (("raw", W), ("centred", W - W.mean(axis=0))):
        _, _, vt = np.linalg.svd(matrix, full_matrices=False)
        for axis, vector in zip("xy", vt[:2]):
            vector = vector if ((matrix @ vector) ** 3).sum() >= 0 else -vector  # the orientation rule
            assert result[name][axis] == pytest.approx(list(matrix[rows.numpy()] @ vector), rel=1e-4, abs=1e-9)
    # raw: the rows' common offset puts the cloud away from the origin along x; centred: around it
    assert np.mean(result["raw"]["x"]) > 2 and abs(np.mean(result["centred"]["x"])) < np.std(result["centred"]["x"])


# ------------------------------------------------------------------ the spec and its CLI


def test_spec_round_trips_and_the_cli_has_one_option_per_field():
    spec = SurveySpec(model="m", text="t.txt", out="o.json", revision="step1000", tokens=300, dtype="bfloat16")
    assert SurveySpec.from_json(spec.to_json()) == spec
    from istar.cli import build_parser

    (subparsers,) = [action for action in build_parser("survey")._actions
                     if isinstance(action, argparse._SubParsersAction)]
    parser = subparsers.choices["survey"]  # istar survey's options, as the command builds them
    options = {action.dest for action in parser._actions} - {"help", "spec"}
    assert options == {f.name for f in dataclasses.fields(SurveySpec)}
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json"])
    assert spec_from_cli(args) == SurveySpec(model="m", text="t.txt", out="o.json")
    args = parser.parse_args(["--model", "m", "--text", "t.txt", "--out", "o.json", "--tokens", "300",
                              "--revision", "step1000", "--dtype", "bfloat16"])
    assert spec_from_cli(args) == spec
    assert spec_from_cli(parser.parse_args(["--spec", spec.to_json()])) == spec
    # the defaults are the workflow's (config key profile.*)
    from istar.pipeline.validate import validate_config

    profile = validate_config({}, check_paths=False)["survey"]
    assert (spec.split, SurveySpec(model="m", text="t", out="o").tokens, spec.zeta) == \
        (profile["split"], profile["tokens"], profile["zeta"])


def test_bad_settings_and_sources_give_one_clear_error(tmp_path, capsys):
    with pytest.raises(SpecError, match="tokens must be at least 2"):
        SurveySpec(model="m", text="t", out="o", tokens=1).validate()
    with pytest.raises(SpecError, match="sigma_tokens must be 0"):
        SurveySpec(model="m", text="t", out="o", sigma_tokens=1).validate()
    with pytest.raises(SpecError, match="twonn_tokens must be 0 .no TwoNN. or at least 3"):
        SurveySpec(model="m", text="t", out="o", twonn_tokens=2).validate()
    with pytest.raises(SpecError, match="projection_rows must be a positive integer"):
        SurveySpec(model="m", text="t", out="o", projection_rows=0).validate()
    with pytest.raises(SpecError, match="SurveySpec has no setting"):
        SurveySpec.from_json(json.dumps({"model": "m", "text": "t", "out": "o", "token": 5}))
    with pytest.raises(ValueError, match="neither a text file nor a prepared task folder"):
        read_texts(str(tmp_path / "missing.txt"))
    code = main(["survey", "--model", "package:no_such_package/model", "--text", "x", "--out", str(tmp_path / "p.json")])
    assert code == 2 and "no_such_package" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_minilm_layers_budgets_and_provenance(minilm_profile):
    provenance, layers = minilm_profile["provenance"], minilm_profile["layers"]
    assert provenance["tokens"] == 80 and provenance["sigma_tokens"] == 50
    assert provenance["num_layers"] == 6 and [entry["layer"] for entry in layers] == list(range(7))
    assert provenance["final_norm"] is None and minilm_profile["final_norm_gain"] is None  # BERT: post-LN blocks
    for entry in layers:
        assert 0 < entry["isoscore"] < 1 and 0 < entry["isoscore_star"] < 1
        assert entry["tokens"] == 80 and entry["mean_norm"] > 0
        assert entry["twonn_tokens"] == 80 and 1 < entry["twonn"] < 80 and 1 < entry["effective_rank"] < 384
    projections = minilm_profile["projections"]["input"]
    assert (projections["rows"], projections["sampled_rows"]) == (30522, 1000)
    assert len(projections["raw"]["x"]) == len(projections["centred"]["y"]) == 1000
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
    assert main(["survey", "--model", str(tiny_model_dir), "--text", str(text_file), "--tokens", str(total + 1000),
                 "--sigma-tokens", "0", "--twonn-tokens", str(total + 5), "--batch-size", "5", "--device", "cpu",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["provenance"]["tokens"] == total
    for entry, rows in zip(result["layers"], stacked):
        assert entry["isoscore"] == pytest.approx(isoscore(rows), abs=1e-6)
        # every token kept for TwoNN (its order does not matter); the spectrum of the stacked rows
        assert entry["twonn_tokens"] == total
        assert entry["twonn"] == pytest.approx(twonn_dimension(rows.float(), 0.1), rel=1e-4)
        lam = np.clip(np.linalg.eigvalsh(np.cov(rows.double().numpy(), rowvar=False)), 0, None)
        p = lam[lam > 0] / lam.sum()
        assert entry["effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-5)
        assert entry["isoscore_star"] is None
        assert entry["mean_norm"] == pytest.approx(float(rows.norm(dim=1).mean()), rel=1e-5)


# ------------------------------------------------------------------ the aggregate CSV and the figures


def synthetic_profile(parameters: int, num_layers: int, seed: int, final_norm: bool, untied: bool) -> dict:
    """A profile JSON as `istar survey` writes it, with made-up measures."""
    rng = np.random.default_rng(seed)

    def measures():
        return {"isoscore": float(rng.uniform(0.01, 0.5)), "isoscore_star": float(rng.uniform(0.01, 0.5)),
                "average_cosine": float(rng.uniform(0, 0.9)), "mean_norm": 5.0, "top1_dim_variance_share": 0.1,
                "top10_dim_variance_share": 0.4, "top1_pc_variance_share": 0.2, "outlier_dims": 2, "tokens": 100,
                "twonn": float(rng.uniform(2, 20)), "twonn_tokens": 100, "effective_rank": float(rng.uniform(2, 16))}

    def static_entry():
        both = float(rng.uniform(0.1, 0.9))
        return {**measures(), "partition_isotropy_both_signs": both, "partition_isotropy_solver_signs": both + 0.05,
                "partition_isotropy_both_signs_centred": 0.5, "partition_isotropy_solver_signs_centred": 0.6,
                "solver_signs_max_exponent": 3.0, "solver_signs_max_exponent_centred": 2.0,
                "solver_signs_fp32_overflow": False, "solver_signs_fp32_overflow_centred": False,
                "average_cosine_centred": 0.0}

    def points(offset):
        return {axis: [float(v) for v in rng.normal(offset, 1.0, 50)] for axis in "xy"}

    static = {"input": static_entry()}
    if untied:
        static["output"] = static_entry()
    projections = {which: {"rows": 500, "sampled_rows": 50, "seed": 0, "raw": points(2.0 + seed % 3),
                           "centred": points(0.0)} for which in static}
    layers = [{"layer": i, **measures()} for i in range(num_layers + 1)]
    if final_norm:
        layers.append({"layer": "pre_final_norm", **measures()})
    return {"provenance": {"parameters": parameters, "num_layers": num_layers, "hidden_size": 16},
            "static": static, "projections": projections, "layers": layers,
            "final_norm_gain": {"coefficient_of_variation": 0.3} if final_norm else None}


def test_profiles_csv_rows_steps_and_kinds(tmp_path):
    from istar.report.survey_aggregate import PROFILE_COLUMNS, aggregate_profiles, revision_step

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
    assert frame["partition_isotropy_solver_signs"].notna().sum() == 2 * 2 + 1  # one per embedding matrix

    from istar.report.survey_aggregate import PROJECTION_COLUMNS, aggregate_projections

    points = aggregate_projections(paths)
    assert list(points.columns) == list(PROJECTION_COLUMNS)
    # small: 2 revisions × 2 matrices × raw/centred × 50 points; enc: its input matrix only
    assert len(points) == 2 * 2 * 2 * 50 + 2 * 50
    first = json.loads(paths[0].read_text())["projections"]["output"]["centred"]
    rows = points[(points["revision"] == "step0") & (points["matrix"] == "output") & points["centred"]]
    assert rows["x"].tolist() == first["x"] and rows["y"].tolist() == first["y"]


def notes_in(figure) -> list[str]:
    """The figure's texts other than the bars' value labels and the galleries' sample sizes:
    the notes saying why a panel is empty."""
    return [text.get_text() for ax in figure.axes for text in ax.texts
            if not re.fullmatch(r"-?[\d.e+-]+|[\d,]+ of [\d,]+ rows", text.get_text())]


@pytest.mark.parametrize("name", ["profile_layers", "profile_steps", "profile_sizes", "profile_final_norm",
                                  "profile_gallery", "profile_gallery_steps"])
def test_profile_figures_draw_and_say_what_they_cannot_show(name, tmp_path):
    from matplotlib.figure import Figure

    from istar.report.figures import FIGURES, draw
    from istar.report.survey_aggregate import aggregate_profiles, aggregate_projections

    aggregate = aggregate_projections if FIGURES[name].data == "profile_projections" else aggregate_profiles

    def frame(entries):
        paths = []
        for model, revision, parameters, final_norm in entries:
            path = tmp_path / name / model / f"{revision}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(synthetic_profile(parameters, 3, len(paths) + 10 * len(model), final_norm,
                                                         untied=final_norm)))
            paths.append(path)
        return aggregate(paths)

    full = frame([("p70m", "step0", 70, True), ("p70m", "step1000", 70, True), ("p160m", "step0", 160, True),
                  ("p160m", "step1000", 160, True), ("minilm", "as-given", 22, False)])
    fig = draw(name, full)
    assert isinstance(fig, Figure)
    drawn = sum(len(ax.lines) + len(ax.collections) + len(ax.patches) for ax in fig.axes)
    # the gallery's row of the encoder (no output matrix) says so in its two output panels
    assert drawn > 0 and notes_in(fig) == (["no output matrix\n(an encoder)"] * 2
                                           if name == "profile_gallery" else [])
    if name == "profile_gallery_steps":  # p70m and p160m, 4 panels each, a column per checkpoint
        assert len(fig.axes) == 8 * 2 and sum(len(ax.collections) for ax in fig.axes) == 16
    # one encoder without revisions or final norm: the steps and final-norm figures say why they are empty
    single = draw(name, frame([("minilm", "as-given", 22, False)]))
    notes = notes_in(single)
    if name in ("profile_steps", "profile_final_norm", "profile_gallery_steps", "profile_gallery"):
        assert notes and all("no " in note for note in notes)
    else:
        assert not notes
    with pytest.raises(ValueError, match="lacks the column"):
        draw(name, full.drop(columns=["x" if aggregate is aggregate_projections else "isoscore"]))


def test_profile_check_defaults_are_the_published_pythia_numbers(capsys):
    from istar.steps.survey_check import PUBLISHED, REFERENCE_KEYS, _reference
    from istar.steps.survey_check import add_cli_arguments as check_arguments

    parser = argparse.ArgumentParser()
    check_arguments(parser)
    args = parser.parse_args([])
    assert (args.model, args.revision) == ("EleutherAI/pythia-70m", "step143000")
    assert _reference(args.reference) == PUBLISHED == {"input": 0.95848, "output": 0.08309, "input_centred": 0.99684,
                                                       "output_centred": 0.97247}
    assert set(REFERENCE_KEYS) == set(PUBLISHED)
    assert main(["survey-check", "--reference", "inputs=0.5"]) == 2
    assert "NAME one of input, output, input_centred, output_centred" in capsys.readouterr().err
