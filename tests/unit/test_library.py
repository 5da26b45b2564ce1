"""The library as a researcher's own training code uses it: the public Σ_S, the isotropy measurement in
memory, and the errors of the common mistakes (each naming the fix). Tiny models and a few rows: seconds."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

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
    public = istar.shrinkage_covariance(model, _texts(data), tokenizer, max_rows=10**9, max_length=64, tokens=tokens,
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
    first = istar.shrinkage_covariance(model, batches, layers=[2], max_rows=one_batch, progress=False)
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
    assert "/4 " in shown and "batch" in shown and "250" not in shown, shown  # out of 4 batches, not of 250k rows
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
