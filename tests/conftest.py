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
