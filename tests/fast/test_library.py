"""The library as a researcher's own training code uses it: the public Σ_S, the isotropy measurement in
memory, and the errors of the common mistakes (each naming the fix). Tiny models and a few rows: seconds."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertModel

import istar
from istar.core.shrinkage import load_shrinkage
from istar.data.storage import read_columns

# ----------------------------------------------------------------------------- Σ_S


def _texts(data_dir, split="train"):
    columns = read_columns(data_dir, split)
    second = columns.get("text_b")
    return list(zip(columns["text_a"], second)) if second is not None and any(second) else list(columns["text_a"])


@pytest.mark.parametrize("tokens", ["real", "all_positions"])
def test_public_sigma_equals_the_file_istar_shrinkage_writes(tiny_model_dir, prepared, tmp_path, tokens):
    """The same rows (the whole training split of 48 RTE pairs) give the same Σ_S: the step's file and
    ``istar.shrinkage_covariance`` on texts + tokenizer. Real tokens do not see padding, so the batches
    may differ; every padded position does, so there both read the split in the same batches."""
    from istar.config.specs import ShrinkageSpec
    from istar.steps.shrinkage import compute_shrinkage_file

    data = prepared("rte")
    out = tmp_path / "sigma0.pt"
    batch = 48 if tokens == "all_positions" else 16  # one batch: the step's shuffled order pads it alike
    compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(data), out=str(out), rows=10**9,
                                         max_length=64, tokens=tokens, batch_size=batch, layers="all"))
    from_file, provenance = load_shrinkage(out)
    model = BertModel.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    public = istar.shrinkage_covariance(model, _texts(data), tokenizer, shrinkage_rows=10**9, max_length=64, tokens=tokens,
                                        batch_size=48 if tokens == "all_positions" else 7, progress=False)
    assert public.shape == (32, 32) and public.dtype == torch.float64
    assert provenance["rows"] > 1000
    torch.testing.assert_close(public, from_file, rtol=1e-5, atol=1e-7)


def test_public_sigma_from_a_dataloader_stops_at_the_row_budget(tiny_model_dir, prepared):
    """Batches from any loader; the budget counts rows of the selected layers (tokens × layers)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = BertModel.from_pretrained(tiny_model_dir).train()
    texts = _texts(prepared("rte"))
    batches = [dict(tokenizer([a for a, _ in texts[i:i + 8]], [b for _, b in texts[i:i + 8]], padding=True,
                              truncation=True, max_length=64, return_tensors="pt")) for i in range(0, 48, 8)]
    one_batch = int(batches[0]["attention_mask"].sum())
    first = istar.shrinkage_covariance(model, batches, layers=[2], shrinkage_rows=one_batch, progress=False)
    assert model.training  # its mode is given back
    expected = istar.CovarianceAccumulator(32)
    with torch.no_grad():
        model.eval()
        expected.add(model(**batches[0], output_hidden_states=True).hidden_states[2], batches[0]["attention_mask"])
    model.train()
    torch.testing.assert_close(first, expected.covariance())


def test_sigma_progress_shows_batches_of_the_real_total_and_can_be_silenced(tiny_model_dir, capsys, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = BertModel.from_pretrained(tiny_model_dir)
    texts = ["a short sentence", "another one, a little longer", "three", "four words are here"] * 4
    istar.shrinkage_covariance(model, texts, tokenizer, batch_size=4)
    shown = capsys.readouterr().err
    # out of 4 batches, not of the 250k-row budget (which the postfix may name: "88 of 250,000 rows")
    assert "/4 " in shown and "batch" in shown and "/250" not in shown, shown
    istar.shrinkage_covariance(model, texts, tokenizer, batch_size=4, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    istar.shrinkage_covariance(model, texts, tokenizer, batch_size=4)
    assert capsys.readouterr().err == ""


def test_texts_without_a_tokenizer_are_named():
    model = BertModel(BertModel.config_class(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=16))
    with pytest.raises(TypeError, match="pass the tokenizer too"):
        istar.shrinkage_covariance(model, ["a sentence", "another"])


# ----------------------------------------------------------------------------- measurement in memory


def test_measure_isotropy_equals_what_istar_measure_reports(tiny_model_dir, prepared, tmp_path):
    """The library's measurement and the analysis of ``istar measure`` (activation statistics, then
    analyze_statistics) give the same numbers on the same validation rows, with the same Σ_S file."""
    from istar.config.specs import ModelData, ShrinkageSpec
    from istar.steps.activations import activation_statistics
    from istar.steps.analyze import ShrinkageReference, analyze_statistics
    from istar.steps.common import open_model_context
    from istar.steps.shrinkage import compute_shrinkage_file

    data = prepared("rte")
    sigma = tmp_path / "sigma0.pt"
    compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(data), out=str(sigma), rows=10**9,
                                         max_length=64))
    context = open_model_context(ModelData(model=str(tiny_model_dir), data_dir=str(data), max_length=64))
    analysis = analyze_statistics(*activation_statistics(context, "validation", batch_size=8),
                                  ShrinkageReference.read(sigma), zeta=0.2)
    model = BertModel.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    report = istar.measure_isotropy(model, _texts(data, "validation"), tokenizer, sigma_s=sigma, zeta=0.2,
                                    max_length=64, batch_size=5, progress=False)
    assert isinstance(report.overall.isoscore_star, float) and isinstance(report.layers[1].twonn_cls, float)
    ours = report.to_dict()
    assert ours["global"]["layers"] == analysis["global"]["layers"] == [1, 2]
    assert ours["global"]["rows"] == analysis["global"]["rows"]
    for key in ("isoscore_star", "isoscore"):
        assert ours["global"][key] == pytest.approx(analysis["global"][key], rel=1e-6)
    for mine, theirs in zip(ours["layers"], analysis["layers"], strict=True):
        assert mine["tokens"] == theirs["tokens"] and mine["layer"] == theirs["layer"]
        for key in ("isoscore_star", "isoscore", "cosine_similarity", "twonn_cls"):
            if theirs[key] is None:  # TwoNN of layer 0's identical [CLS] embeddings
                assert mine[key] is None
            else:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (mine["layer"], key)
    assert ours["warnings"] == analysis["warnings"]


def test_isotropy_metric_streams_batches_and_takes_a_sigma_tensor(tiny_bert):
    """Batches streamed into the metric give the scores of the rows stacked; one (d, d) Σ_S scores the overall
    cloud only; the return types are floats."""
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (6, 10))
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[3:, 7:] = 0
    with torch.no_grad():
        states = tiny_bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    rows = torch.cat([states[1][mask.bool()], states[2][mask.bool()], states[3][mask.bool()]])
    sigma = torch.cov(rows.double().T) * 0.5 + torch.eye(16, dtype=torch.float64)
    metric = istar.IsotropyMetric(zeta=0.3, sigma_s=sigma)
    metric.update([s[:3] for s in states], mask[:3])
    metric.update([s[3:] for s in states], mask[3:])
    report = metric.compute()
    assert report.overall.isoscore_star == pytest.approx(float(istar.isoscore_star(rows.double(), 0.3, sigma)), rel=1e-6)
    assert report.overall.isoscore == pytest.approx(istar.isoscore(rows.double()), rel=1e-6)
    assert report.layers[2].isoscore == pytest.approx(istar.isoscore(states[2][mask.bool()].double()), rel=1e-6)
    assert report.layers[2].isoscore_star is None and report.tokens == int(mask.sum())
    assert report.layers[3].cosine_similarity == pytest.approx(
        istar.average_cosine_similarity(states[3][mask.bool()]), rel=1e-6)
    metric.reset()
    with pytest.raises(ValueError, match="no batch was added"):
        metric.compute()


# ----------------------------------------------------------------------------- the common mistakes


@pytest.fixture
def batch_outputs(tiny_bert):
    ids = torch.randint(0, 100, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[2:, 6:] = 0
    return tiny_bert(input_ids=ids, attention_mask=mask, output_hidden_states=True), mask


def test_a_model_called_without_hidden_states_is_named(tiny_bert, batch_outputs):
    outputs, mask = batch_outputs
    plain = tiny_bert(input_ids=torch.ones(4, 9, dtype=torch.long), attention_mask=mask)
    for penalty in (istar.istar_penalty, istar.global_istar_penalty):
        with pytest.raises(ValueError, match=r"hidden_states is None: call the model with output_hidden_states=True"):
            penalty(plain.hidden_states, mask, lam=-1.0, zeta=0.0, sigma_s=None)
    with pytest.raises(ValueError, match="not last_hidden_state"):
        istar.cosreg_penalty(outputs.last_hidden_state, mask)
    with pytest.raises(ValueError, match=r"tuple of \(B, T, d\) tensors"):
        istar.istar_penalty([h[0] for h in outputs.hidden_states], mask, lam=1.0, zeta=0.0, sigma_s=None)


def test_a_missing_or_mismatched_mask_is_named(batch_outputs):
    outputs, mask = batch_outputs
    with pytest.raises(ValueError, match=r"attention_mask is None: pass batch\['attention_mask'\]"):
        istar.istar_penalty(outputs.hidden_states, None, lam=-1.0, zeta=0.0, sigma_s=None)
    with pytest.raises(ValueError, match=r"attention_mask shape \(4, 8\) does not match hidden states \(4, 9\)"):
        istar.cosreg_penalty(outputs.hidden_states, mask[:, :8])
    # every padded position needs no mask: the rows are all B·T positions
    everything = istar.istar_penalty(outputs.hidden_states, None, lam=-1.0, zeta=0.0, sigma_s=None, tokens="all_positions")
    assert int(everything.logs["penalty_rows"]) == 3 * 4 * 9


def test_a_sigma_of_another_model_is_named(batch_outputs):
    outputs, mask = batch_outputs
    with pytest.raises(ValueError, match="compute Σ_S on the same model"):
        istar.istar_penalty(outputs.hidden_states, mask, lam=-1.0, zeta=0.2, sigma_s=torch.eye(8))
    metric = istar.IsotropyMetric(zeta=0.2, sigma_s=torch.eye(8), twonn=False)
    metric.update(outputs.hidden_states, mask)
    with pytest.raises(ValueError, match=r"sigma_s has shape \(8, 8\) but the points have d = 16: compute Σ_S on the"):
        metric.compute()


def test_the_global_penalty_in_one_process_is_the_local_one(batch_outputs):
    """No process group (plain ``python``): the global batch is the local batch, so one script runs under
    ``python`` and under ``accelerate launch``."""
    outputs, mask = batch_outputs
    sigma = torch.eye(16, dtype=torch.float64)
    local = istar.istar_penalty(outputs.hidden_states, mask, lam=-1.0, zeta=0.2, sigma_s=sigma)
    overall = istar.global_istar_penalty(outputs.hidden_states, mask, lam=-1.0, zeta=0.2, sigma_s=sigma)
    assert float(overall.term.detach()) == float(local.term.detach())
    assert float(overall.logs["isoscore_star"]) == float(local.logs["isoscore_star"])
    assert isinstance(istar.Penalty(term=local.term), istar.Penalty)


# ----------------------------------------------------------------------------- IStarConfig


def test_every_registry_method_reaches_the_config_with_its_own_defaults():
    """IStarConfig asks the method registry: each method is accepted, λ defaults as the registry says (CosReg's
    from the schema's final.cosreg_lambda, none for I-STAR), ζ only where the method takes it."""
    from istar.config.schema import default_of
    from istar.registry.methods import METHODS

    for key, method in METHODS.items():
        needs_lam = method.takes("lam") and method.default_lam_key is None
        config = istar.IStarConfig(method=key, **({"lam": -1.0} if needs_lam else {}))
        assert config.entry is method
        if method.default_lam_key is not None:
            assert config.lam == float(default_of(method.default_lam_key))
        assert config.zeta == (default_of("$defs.zeta") if method.takes("zeta") else 0.0)


@pytest.mark.parametrize(("settings", "message"), [
    ({}, r"^method 'istar' needs lam \(λ\): IStarConfig\(lam=-1.0, zeta=0.2\)"),
    ({"method": "whitening", "lam": 1.0}, r"^unknown method 'whitening'; known methods: base, cosreg, istar$"),
    ({"method": "cosreg", "zeta": 0.2}, r"^method 'cosreg' takes no zeta; got zeta=0.2: leave it out$"),
    ({"lam": 500.0}, r"^lam must lie in \[-100, 100\]; got 500.0$"),
    ({"lam": -1.0, "zeta": 1.5}, r"^zeta must lie in \[0, 1\]; got 1.5$"),
    ({"lam": float("nan")}, r"^lam must lie in \[-100, 100\]; got nan$"),
    ({"lam": -1.0, "zeta": 0.0, "sigma_s": torch.eye(4)}, r"^sigma_s is given but method='istar' with zeta=0.0 reads no"),
    ({"lam": -1.0, "sigma_s": torch.ones(4, 5)}, r"^sigma_s must be a square \(d, d\) matrix; got shape \(4, 5\)$"),
    ({"lam": -1.0, "sigma_s": torch.full((4, 4), float("nan"))}, r"^sigma_s contains NaN or inf: give a covariance"),
    ({"lam": -1.0, "sigma_s": -torch.eye(4)}, r"^sigma_s is not positive semi-definite \(an eigenvalue is -1\): give"),
    ({"lam": -1.0, "sigma_s": torch.eye(4) + torch.triu(torch.ones(4, 4), 1)},
     r"^sigma_s is not symmetric \(entries differ from their transposes by up to 1\): give a covariance matrix"),
])
def test_a_config_out_of_the_registry_or_the_schema_is_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as error:
        istar.IStarConfig(**settings)
    assert "\n" not in str(error.value)
