"""Newer encoders — ModernBERT, DeBERTa-v3, RoBERTa — served by the test hub as tiny random models
built from their configs: Σ_S, one I-STAR and one CosReg step, a measurement each; hidden states
of the expected shape with padding kept out of the penalty; and a model whose architecture gives
no single stack of per-layer hidden states refused when the config is validated."""

from __future__ import annotations

import json

import pytest
import torch
from fixture_parts import HUB_ENCODERS
from hub_server import reload_hub_constants

from istar.config.schema import ConfigError
from istar.config.specs import MeasureSpec, ShrinkageSpec, TrainSpec
from istar.core.regularizers import cosreg_penalty, istar_penalty
from istar.data.encoding import encode_split, make_loader
from istar.models.loading import load_model, load_tokenizer
from istar.registry.tasks import get_task
from istar.steps.measure import measure_runs
from istar.core.shrinkage import load_shrinkage
from istar.steps.shrinkage import compute_shrinkage_file
from istar.steps.train import train

LAYERS = 2  # tiny_model_files: 2 layers of width 32
WIDTH = 32


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    for name, value in hub.env(tmp_path / "hf").items():
        monkeypatch.setenv(name, value)
    reload_hub_constants(monkeypatch)


def _attention_implementations(model_class) -> list[str]:
    """The implementations a CPU offers this architecture (DeBERTa has no SDPA path; flash attention needs a GPU)."""
    return ["eager"] + (["sdpa"] if getattr(model_class, "_supports_sdpa", False) else [])


@pytest.mark.parametrize("kind", sorted(HUB_ENCODERS))
def test_hidden_states_are_one_row_per_token_and_padding_stays_out(kind, hub, online, prepared):
    repo = HUB_ENCODERS[kind]
    task = get_task("rte")
    tokenizer = load_tokenizer(repo)
    from istar.data import read_split

    features = encode_split(read_split(prepared("rte"), "validation"), task, tokenizer, max_length=64)
    batch = next(iter(make_loader(features, tokenizer, batch_size=6)))
    mask = batch["attention_mask"]
    assert (mask == 0).any(), "the batch needs padding for this test"
    implementations = _attention_implementations(type(load_model(repo, task)))
    for implementation in implementations:
        torch.manual_seed(0)
        model = load_model(repo, task)
        model.set_attn_implementation(implementation)
        model.eval()
        with torch.no_grad():
            out = model(**batch, output_hidden_states=True)
        # embeddings + L layers, each padded back to (B, T, d): no un-padded (tokens, d) tensors
        assert len(out.hidden_states) == LAYERS + 1
        assert all(tuple(h.shape) == (*mask.shape, WIDTH) for h in out.hidden_states), implementation
        # a padded example's real tokens are what it gives alone, without padding
        row = int(mask.sum(1).argmin())
        length = int(mask[row].sum())
        with torch.no_grad():
            alone = model(**{k: v[row:row + 1, :length] for k, v in batch.items() if k != "labels"},
                          output_hidden_states=True)
        for padded, single in zip(out.hidden_states, alone.hidden_states, strict=True):
            torch.testing.assert_close(padded[row, :length], single[0], atol=1e-5, rtol=1e-5)
        # the penalties read one row per real token: garbage at padded positions changes nothing
        spoiled = [h.masked_fill(~mask.bool()[..., None], 1e4) for h in out.hidden_states]
        for penalty in (lambda hs: istar_penalty(hs, mask, lam=-1.0, zeta=0.0, sigma_s=None, layers="all"),
                        lambda hs: cosreg_penalty(hs, mask, lam=1.0)):
            assert float(penalty(spoiled).term) == pytest.approx(float(penalty(out.hidden_states).term), rel=1e-6)


@pytest.mark.parametrize("kind", sorted(HUB_ENCODERS))
def test_sigma_istar_and_cosreg_steps_and_a_measurement(kind, hub, online, prepared, tmp_path):
    repo, data = HUB_ENCODERS[kind], prepared("rte", 8, 16)
    sigma = tmp_path / "sigma0.pt"
    compute_shrinkage_file(ShrinkageSpec(model=repo, data_dir=str(data), out=str(sigma), rows=1000, batch_size=8))
    matrix, provenance = load_shrinkage(sigma)
    assert matrix.shape == (WIDTH, WIDTH) and provenance["rows"] > 0
    runs = []
    for method, lam in (("istar", -1.0), ("cosreg", 1.0)):
        out = tmp_path / method
        report = train(TrainSpec(model=repo, data_dir=str(data), output_dir=str(out), method=method, lam=lam,
                                 zeta=0.2, sigma_s=str(sigma), epochs=1, batch_size=8, shrinkage_rows=1000,
                                 max_length=64, learning_rate=1e-4))
        assert report["final"]["step"] == 1  # one optimizer step of 8 examples
        config = json.loads((out / "run_config.json").read_text())
        assert config["model_path"] == repo and config["provenance"]["git"]["commit"]
        runs.append(str(out))
    measured = measure_runs(MeasureSpec(runs=runs, data_dir=str(data), sigma_s=str(sigma), out=str(tmp_path / "m.json"),
                                        evaluate=True, batch_size=8, max_length=64,
                                        shrinkage_rows=1000))
    for run in runs:
        analysis = measured["runs"][run]["analysis"]
        assert len(analysis["layers"]) == LAYERS + 1
        assert 0 <= analysis["global"]["isoscore_star"] <= 1
        assert measured["runs"][run]["evaluation"]["metric"] == "accuracy"
    assert measured["provenance"]["versions"]["transformers"]


@pytest.mark.parametrize("model_type, reason", [
    ("t5", "t5 is an encoder-decoder"),
    ("vit", "vit has no sequence-classification head"),
    ("no-such-model", "model_type 'no-such-model' is unknown to transformers"),
])
def test_a_model_without_per_layer_hidden_states_is_refused_at_validation(model_type, reason, tmp_path, monkeypatch):
    from istar.pipeline.validate import validate_config

    monkeypatch.setenv("ISTAR_CACHE_DIR", str(tmp_path / "cache"))  # computed here, then remembered
    folder = tmp_path / model_type
    folder.mkdir()
    settings = {"model_type": model_type, "num_layers": 2, "num_hidden_layers": 2}
    if model_type == "t5":
        settings["is_encoder_decoder"] = True
    (folder / "config.json").write_text(json.dumps(settings))
    verdicts = tmp_path / "cache" / "hidden-states.json"
    for computed in (True, False):
        with pytest.raises(ConfigError) as error:
            validate_config({"models": {"odd": str(folder)}, "tasks": ["rte"],
                             "data": {"mirror": "config/demo-data"}}, check_paths=True)
        assert "config key 'models.odd'" in str(error.value) and reason in str(error.value)
        if computed:  # marked, to see that the second answer comes from the file
            verdicts.write_text(json.dumps({key: f"(remembered) {verdict}"
                                            for key, verdict in json.loads(verdicts.read_text()).items()}))
    assert "(remembered)" in str(error.value)
    if model_type != "no-such-model":  # a hub model is checked when a step loads it, before its weights
        with pytest.raises(ValueError, match=reason):
            load_model(str(folder), get_task("rte"))
