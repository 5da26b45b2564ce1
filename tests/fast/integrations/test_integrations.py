"""The integrations beyond IStarTrainer, trained for real on the packaged MiniLM: the sentence-transformers loss with
SentenceTransformerTrainer, TRL's SFTTrainer through the mixin, the model wrapper in a transformers.Trainer and in a plain
accelerate loop (the Lightning recipe of docs/library.md runs in tests/integration/test_docs.py)."""

from __future__ import annotations

import pytest
import torch
from integrations_helpers import SENTENCES
from trainer_runs import MINILM
from wrapper_step import step_split

import istar
from istar.models.loading import resolve_model_source


def test_the_sentence_transformers_loss_refuses_what_it_cannot_penalise():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    model = SentenceTransformer(resolve_model_source(MINILM), device="cpu")
    with pytest.raises(TypeError, match=r"\(IStarLoss\(model, loss, IStarConfig\(lam=..., zeta=...\)\)\); got dict$"):
        istar.IStarLoss(model, losses.MultipleNegativesRankingLoss(model), {"lam": -1.0})
    with pytest.raises(ValueError, match="embeds without gradients .GradCache.*wrap its uncached form"):
        istar.IStarLoss(model, losses.CachedMultipleNegativesRankingLoss(model), istar.IStarConfig(lam=-1.0))
    loss = istar.IStarLoss(model, losses.MultipleNegativesRankingLoss(model), istar.IStarConfig(lam=-1.0))
    with pytest.raises(ValueError, match=r"no texts were given: IStarLoss\(model, loss, istar, sigma_data="):
        loss.refresh_sigma(0)
    features = [model.preprocess(SENTENCES[:2]), model.preprocess(SENTENCES[2:4])]
    with pytest.raises(ValueError, match=r"no Σ_S yet: pass callbacks=\[IStarCallback\(loss\)\]"):
        loss(features, None)


def test_the_sentence_transformers_loss_composes_outside_matryoshka_and_is_refused_inside():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    model = SentenceTransformer(resolve_model_source(MINILM), device="cpu")
    features = [model.preprocess(SENTENCES[:2]), model.preprocess(SENTENCES[2:4])]
    ranking = losses.MultipleNegativesRankingLoss(model)
    inside = losses.MatryoshkaLoss(model, istar.IStarLoss(model, ranking, istar.IStarConfig(lam=-1.0, zeta=0.0)), [384, 64])
    with pytest.raises(ValueError, match=r"^IStarLoss runs inside a loss that replaced the model's forward "
                                         r"\(ForwardDecorator\).*put IStarLoss outside, IStarLoss\(model, MatryoshkaLoss"):
        inside(features, None)
    outside = istar.IStarLoss(model, losses.MatryoshkaLoss(model, ranking, [384, 64]), istar.IStarConfig(lam=-1.0, zeta=0.0))
    parts = outside(features, None)
    assert sorted(parts) == ["istar_penalty", "task_loss"] and float(parts["istar_penalty"].detach()) < 0
    assert parts["task_loss"].requires_grad and parts["istar_penalty"].requires_grad


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
    with pytest.raises(TypeError, match=r"^Linear.forward takes no output_hidden_states, which IStarModel passes .*"
                                        r"istar.istar_penalty\(hidden_states, attention_mask"):
        istar.IStarModel(torch.nn.Linear(4, 4), istar.IStarConfig(lam=-1.0))
    fixed = istar.IStarModel(tiny_bert, istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(16),
                                                          recompute_shrinkage=False))
    assert fixed.refresh_sigma(0) is not None and fixed.refresh_sigma(1) is None and fixed.sigma_epoch == 0


def test_the_wrapper_is_the_model_through_a_subclass_and_copies_and_pickles_as_one(tiny_bert):
    import copy
    import io

    from transformers import BertModel

    wrapped = istar.IStarModel(tiny_bert, istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(16)))
    wrapped.refresh_sigma(0)
    assert isinstance(wrapped, BertModel) and type(tiny_bert) is BertModel and type(wrapped).__name__ == "BertModel"
    assert list(wrapped.state_dict()) == list(tiny_bert.state_dict()) and wrapped.embeddings is tiny_bert.embeddings
    buffer = io.BytesIO()
    torch.save(wrapped, buffer)
    buffer.seek(0)
    for twin in (copy.deepcopy(wrapped), torch.load(buffer, weights_only=False)):
        assert type(twin) is type(wrapped) and twin.sigma_epoch == 0 and torch.equal(twin.sigma_s, wrapped.sigma_s)
        assert twin.embeddings is not wrapped.embeddings
        assert torch.equal(twin.embeddings.word_embeddings.weight, wrapped.embeddings.word_embeddings.weight)


def test_the_callback_finds_its_wrapper_as_the_trainers_model_or_names_what_is_missing(tiny_bert):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments("unused", use_cpu=True, disable_tqdm=True, report_to=[])
    wrapped = istar.IStarModel(tiny_bert, istar.IStarConfig(lam=-1.0, zeta=0.2, sigma_s=torch.eye(16)))
    callback = istar.IStarCallback()
    callback.on_train_begin(args, TrainerState(), TrainerControl(), model=wrapped)
    assert callback.target is wrapped and wrapped.sigma_epoch == 0 and torch.equal(wrapped.sigma_s, torch.eye(16).double())
    with pytest.raises(TypeError, match=r"^IStarCallback\(\) found a BertModel as the Trainer's model, not an IStarModel"):
        istar.IStarCallback().on_train_begin(args, TrainerState(), TrainerControl(), model=tiny_bert)


def test_a_trainer_that_normalises_by_the_step_tokens_weighs_each_penalty_by_its_share():
    from istar.integrations.wrapper import penalty_share

    labels = torch.tensor([[-100, 5, 6, -100], [-100, 7, -100, -100]])
    assert penalty_share(labels, None) == 1.0
    assert float(penalty_share(labels, torch.tensor(6))) == pytest.approx(3 / 6)
    assert float(penalty_share(labels, 6, shifted=True)) == pytest.approx(3 / 6)
    assert float(penalty_share(torch.tensor([[1, 2, 3]]), 4, shifted=True)) == pytest.approx(2 / 4)


# two Trainers of one optimizer step on width-16 models: about 4 CPU seconds
def test_the_wrapper_in_a_plain_trainer_weighs_task_and_penalty_alike_under_accumulation(tmp_path):
    """Four micro-batches per step: the optimizer's gradient is the micro-batch mean of the task loss's gradient plus
    that of the penalty's (IStarTrainer's proportion), for a classifier's mean loss and a causal LM's token loss."""
    for kind in ("classifier", "causal_lm"):
        split = step_split(tmp_path / kind, kind, accumulation=4)
        assert split["task"] == pytest.approx(1.0, abs=1e-5) and split["penalty"] == pytest.approx(1.0, abs=1e-5), split
        assert split["residual"] < 1e-5, split
