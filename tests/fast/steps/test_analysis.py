"""Tests of the analysis (of ``istar measure``) against direct computations on the token vectors of a real run."""

import json

import pytest
import torch
from analysis_helpers import ZETA, measured, result, run

from istar.core.baseline_measures import average_cosine_similarity
from istar.core.isotropy import isoscore, isoscore_star_from_covariance
from istar.core.twonn import twonn_dimension
from istar.core.shrinkage import load_shrinkage
from istar.steps.analyze import ShrinkageReference, analyze_statistics


def analyze(run, sigma, zeta, **options):
    return analyze_statistics(*run["statistics"], ShrinkageReference.read(sigma), zeta, **options)


def test_the_measurement_file_holds_the_analysis_of_the_statistics(run, measured, result):
    written = json.loads((run["root"] / "measures.json").read_text())
    assert written["runs"][str(run["run"])]["analysis"] == json.loads(json.dumps(result))
    assert result == analyze(run, run["sigma"], ZETA)
    n = run["tokens"][0].shape[0]
    assert result["model"].endswith("model") and result["task"] == "rte" and result["split"] == "validation"
    assert result["zeta"] == ZETA and result["sigma_s"] == str(run["sigma"]) and result["tokens"] == n
    assert result["global"]["layers"] == [1, 2] and result["global"]["rows"] == 2 * n
    assert [layer["layer"] for layer in result["layers"]] == [0, 1, 2]
    assert all(layer["tokens"] == n for layer in result["layers"])
    assert len(result["last_layer"]["mean"]) == len(result["last_layer"]["std"]) == 32
    # the embedding output of [CLS] is the same vector for every example: TwoNN is undefined there
    assert result["layers"][0]["twonn_cls"] is None
    assert result["warnings"] == ["layer 0: TwoNN of the [CLS] vectors is undefined "
                                  "(TwoNN needs at least 3 distinct points; got 1)"]


def test_global_scores_equal_the_covariance_of_the_stacked_tokens(run, result):
    rows = torch.cat(run["tokens"][1:])
    sigma_s, _ = load_shrinkage(run["sigma"], expected_layers=[1, 2])
    expected = isoscore_star_from_covariance(torch.cov(rows.T), ZETA, sigma_s)
    assert result["global"]["isoscore_star"] == pytest.approx(float(expected), rel=1e-5)
    assert result["global"]["isoscore"] == pytest.approx(isoscore(rows), rel=1e-5)
    assert result["global"]["isoscore_star"] != pytest.approx(result["global"]["isoscore"], rel=1e-3)


def test_per_layer_values_equal_direct_computations(run, result):
    for layer, entry in enumerate(result["layers"]):
        rows = run["tokens"][layer]
        sigma_s, _ = load_shrinkage(run["sigma"], expected_layers=[layer])
        expected_star = isoscore_star_from_covariance(torch.cov(rows.T), ZETA, sigma_s)
        assert entry["isoscore_star"] == pytest.approx(float(expected_star), rel=1e-5)
        assert entry["isoscore"] == pytest.approx(isoscore(rows), rel=1e-5)
        assert entry["cosine_similarity"] == pytest.approx(average_cosine_similarity(rows), rel=1e-5, abs=1e-9)
        if layer == 0:
            with pytest.raises(ValueError, match="at least 3 distinct points"):
                twonn_dimension(run["cls"][0], 0.1)
        else:
            assert entry["twonn_cls"] == pytest.approx(twonn_dimension(run["cls"][layer], 0.1), rel=1e-3)
    last = run["tokens"][-1]
    torch.testing.assert_close(torch.tensor(result["last_layer"]["mean"], dtype=torch.float64), last.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(result["last_layer"]["std"], dtype=torch.float64), last.std(0), rtol=1e-5, atol=1e-6)


def test_zeta_zero_is_vanilla_isoscore_and_layer_selection(run, result):
    plain = analyze(run, run["sigma"], 0.0)
    assert plain["global"]["isoscore_star"] == pytest.approx(plain["global"]["isoscore"], rel=1e-12)
    for entry in plain["layers"]:
        assert entry["isoscore_star"] == pytest.approx(entry["isoscore"], rel=1e-12)
    one = analyze(run, run["sigma"], ZETA, layers=2, twonn_discard=0.2)
    assert one["global"]["layers"] == [2] and one["global"]["rows"] == result["tokens"]
    assert one["global"]["isoscore_star"] == pytest.approx(result["layers"][2]["isoscore_star"], rel=1e-12)
    assert one["layers"][2]["twonn_cls"] == pytest.approx(twonn_dimension(run["cls"][2], 0.2), rel=1e-3)
    everything = analyze(run, run["sigma"], ZETA, layers="all+embeddings")
    sigma_s, _ = load_shrinkage(run["sigma"], expected_layers=[0, 1, 2])
    expected = isoscore_star_from_covariance(torch.cov(torch.cat(run["tokens"]).T), ZETA, sigma_s)
    assert everything["global"]["isoscore_star"] == pytest.approx(float(expected), rel=1e-5)


def test_undefined_twonn_is_recorded_not_fatal(run, result):
    tensors, metadata = run["statistics"]
    tensors = {**tensors, "cls.layer1": tensors["cls.layer1"][:2].repeat(12, 1)}  # two distinct vectors
    degenerate = analyze_statistics(tensors, metadata, ShrinkageReference.read(run["sigma"]), ZETA)
    assert [layer["twonn_cls"] is None for layer in degenerate["layers"]] == [True, True, False]
    assert degenerate["warnings"][1] == ("layer 1: TwoNN of the [CLS] vectors is undefined "
                                         "(TwoNN needs at least 3 distinct points; got 2)")
    assert degenerate["layers"][1]["isoscore_star"] == pytest.approx(result["layers"][1]["isoscore_star"], rel=1e-12)


def test_invalid_settings_and_a_missing_sigma_file_raise(run, tmp_path):
    # a Σ_S of another task or shape is refused before a model loads (istar.steps.measure.check_inputs,
    # tests/fast/test_reliability_early.py)
    with pytest.raises(ValueError, match="zeta must lie in"):
        analyze(run, run["sigma"], 1.5)
    with pytest.raises(ValueError, match="twonn_discard"):
        analyze(run, run["sigma"], ZETA, twonn_discard=1.0)
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        analyze(run, run["sigma"], ZETA, layers=7)
    with pytest.raises(FileNotFoundError, match="istar shrinkage"):
        ShrinkageReference.read(tmp_path / "none.pt")
