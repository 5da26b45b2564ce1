"""The integrations beyond IStarTrainer, trained for real on the packaged MiniLM: the sentence-transformers loss with
SentenceTransformerTrainer, TRL's SFTTrainer through the mixin, the model wrapper in a transformers.Trainer and in a plain
accelerate loop (the Lightning recipe of docs/library.md runs in tests/integration/test_docs.py)."""

from __future__ import annotations

import pytest
import torch
from integrations_helpers import SENTENCES
from trainer_runs import MINILM

import istar
from istar.models.loading import resolve_model_source


def test_the_sentence_transformers_loss_refuses_what_it_cannot_penalise():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    model = SentenceTransformer(resolve_model_source(MINILM), device="cpu")
    with pytest.raises(ValueError, match="embeds without gradients .GradCache.*wrap its uncached form"):
        istar.IStarLoss(model, losses.CachedMultipleNegativesRankingLoss(model), istar.IStarConfig(lam=-1.0))
    loss = istar.IStarLoss(model, losses.MultipleNegativesRankingLoss(model), istar.IStarConfig(lam=-1.0))
    with pytest.raises(ValueError, match=r"no texts were given: IStarLoss\(model, loss, istar, sigma_data="):
        loss.refresh_sigma(0)
    features = [model.preprocess(SENTENCES[:2]), model.preprocess(SENTENCES[2:4])]
    with pytest.raises(ValueError, match=r"no Σ_S yet: pass callbacks=\[IStarCallback\(loss\)\]"):
        loss(features, None)


def test_the_batches_of_several_forward_passes_are_one_padded_batch():
    from istar.integrations.sentence_transformers import union_of_batches

    first = ((torch.ones(2, 3, 4), torch.ones(2, 3, 4)), torch.ones(2, 3, dtype=torch.long))
    second = ((torch.full((1, 5, 4), 2.0), torch.full((1, 5, 4), 2.0)), torch.ones(1, 5, dtype=torch.long))
    states, mask = union_of_batches([first, second])
    assert [tuple(s.shape) for s in states] == [(3, 5, 4), (3, 5, 4)] and mask.tolist() == [
        [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    rows = istar.core.regularizers.token_rows(states, mask)
    assert rows.shape == (11, 4) and set(rows.unique().tolist()) == {1.0, 2.0}


def test_the_wrapper_names_what_is_missing_before_work(tiny_bert):
    batch = {"input_ids": torch.tensor([[1, 54, 2]]), "labels": torch.tensor([[1, 54, 2]])}
    with pytest.raises(TypeError, match=r"IStarModel\(model, IStarConfig\(lam=..., zeta=...\)\)"):
        istar.IStarModel(tiny_bert, {"lam": -1.0})
    model = istar.IStarModel(tiny_bert, istar.IStarConfig(lam=-1.0, zeta=0.2)).train()
    with pytest.raises(ValueError, match=r"no data was given: IStarModel\(model, istar, sigma_data=DataLoader"):
        model.refresh_sigma(0)
    with pytest.raises(ValueError, match=r"^the model's inputs have no attention_mask \(keys: input_ids, labels\)"):
        model(**batch)
    with pytest.raises(ValueError, match=r"no Σ_S yet: call refresh_sigma\(epoch\)"):
        model(**batch, attention_mask=torch.ones(1, 3, dtype=torch.long))
    fixed = istar.IStarModel(tiny_bert, istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(16),
                                                          recompute_shrinkage=False))
    assert fixed.refresh_sigma(0) is not None and fixed.refresh_sigma(1) is None and fixed.sigma_epoch == 0


def test_a_trainer_that_normalises_by_the_step_tokens_weighs_each_penalty_by_its_share():
    from istar.integrations.wrapper import penalty_share

    labels = torch.tensor([[-100, 5, 6, -100], [-100, 7, -100, -100]])
    assert penalty_share(labels, None) == 1.0
    assert float(penalty_share(labels, torch.tensor(6))) == pytest.approx(3 / 6)
    assert float(penalty_share(labels, 6, shifted=True)) == pytest.approx(3 / 6)
    assert float(penalty_share(torch.tensor([[1, 2, 3]]), 4, shifted=True)) == pytest.approx(2 / 4)
