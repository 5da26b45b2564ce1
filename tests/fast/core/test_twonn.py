"""TwoNN's two neighbour searches (k-d tree, exhaustive) give identical estimates."""

import math

import numpy as np
import pytest
import torch

from istar.core.twonn import KDTREE_MAX_DIM, twonn_dimension


def _swiss_roll(n: int, rng) -> np.ndarray:
    t = 1.5 * math.pi * (1.0 + 2.0 * rng.random(n))
    return np.column_stack([t * np.cos(t), 21.0 * rng.random(n), t * np.sin(t)])


@pytest.mark.parametrize("d", [3, 12, KDTREE_MAX_DIM + 8])
def test_kdtree_and_exhaustive_search_agree_exactly(d):
    rng = np.random.default_rng(d)
    X = _swiss_roll(1500, rng) if d == 3 else rng.standard_normal((1500, 6)) @ rng.standard_normal((6, d))
    X = np.vstack([X, X[:100]])  # duplicates are collapsed the same way by both
    tree = twonn_dimension(X, search="kdtree")
    assert tree == twonn_dimension(X, search="exhaustive", chunk_size=257)
    assert tree == twonn_dimension(torch.as_tensor(X), search="auto")
    assert tree == pytest.approx(2.0 if d == 3 else 6.0, rel=0.15)


def test_unknown_search_is_a_clear_error():
    with pytest.raises(ValueError, match="search must be one of auto, kdtree, exhaustive; got 'ball'"):
        twonn_dimension(np.random.default_rng(0).standard_normal((10, 3)), search="ball")
