"""Tests of istar.core.regularizers: the I-STAR and CosReg penalties on model hidden states."""

import numpy as np
import pytest
import torch

from istar.core.isotropy import isoscore_star
from istar.core.regularizers import cosreg_penalty, global_istar_penalty, istar_penalty, resolve_layers, token_rows


def random_hidden_states(num_layers=4, batch=3, length=7, dim=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, length, dim, dtype=torch.float64, generator=g).requires_grad_()
                 for _ in range(num_layers + 1))


def padded_mask(lengths, length=7):
    return (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()


def test_resolve_layers():
    assert resolve_layers("all", 5) == [1, 2, 3, 4]
    assert resolve_layers("all+embeddings", 5) == [0, 1, 2, 3, 4]
    assert resolve_layers(-1, 5) == [4]
    assert resolve_layers([3, 1, 3], 5) == [1, 3]
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        resolve_layers(5, 5)
    with pytest.raises(ValueError, match="unknown layer selection"):
        resolve_layers("last", 5)
    with pytest.raises(ValueError, match="empty"):
        resolve_layers([], 5)


def test_token_rows_excludes_padding_and_stacks_layers():
    states = random_hidden_states()
    mask = padded_mask([7, 4, 2])
    rows = token_rows(states, mask, "all")
    assert rows.shape == (4 * 13, 5)
    torch.testing.assert_close(rows[:13], states[1][mask.bool()])
    assert token_rows(states, mask, 2).shape == (13, 5)
    assert token_rows(states, mask, "all+embeddings").shape == (5 * 13, 5)


def test_istar_penalty_value_and_logs():
    states = random_hidden_states()
    mask = padded_mask([7, 5, 3])
    sigma_s = torch.cov(torch.randn(500, 5, dtype=torch.float64).T)
    penalty = istar_penalty(states, mask, lam=-2.0, zeta=0.3, sigma_s=sigma_s)
    score = isoscore_star(token_rows(states, mask), 0.3, sigma_s)
    assert penalty.term.item() == pytest.approx(-2.0 * (1 - score.item()), rel=1e-6)
    assert penalty.logs["isoscore_star"].item() == pytest.approx(score.item())
    assert not penalty.logs["isoscore_star"].requires_grad
    penalty.term.backward()
    assert all(s.grad is not None for s in states[1:]) and states[0].grad is None


@pytest.mark.parametrize("penalty", [istar_penalty, global_istar_penalty])
@pytest.mark.parametrize("lam", [float("nan"), float("inf")])
def test_a_lambda_that_is_not_finite_is_refused(penalty, lam):
    with pytest.raises(ValueError, match=r"^lam must be a finite number \(λ < 0 lowers isotropy, > 0 raises it\); got "):
        penalty(random_hidden_states(), padded_mask([7, 5, 3]), lam=lam, zeta=0.0, sigma_s=None)
    with pytest.raises(ValueError, match="^lam must be a finite number"):
        cosreg_penalty(random_hidden_states(), padded_mask([7, 5, 3]), lam=lam)


def cosreg_double_loop(rows, lam):
    unit = rows / rows.norm(dim=1, keepdim=True)
    m = len(unit)
    total = sum(float(unit[i] @ unit[j]) for i in range(m) for j in range(m) if i != j)
    return lam * total / m**2


def test_cosreg_equals_double_loop():
    states = random_hidden_states(seed=3)
    mask = padded_mask([6, 7, 1])
    penalty = cosreg_penalty(states, mask, lam=1.0)
    rows = states[-1][mask.bool()]
    assert penalty.term.item() == pytest.approx(cosreg_double_loop(rows.detach(), 1.0), rel=1e-5)
    m = len(rows)
    assert penalty.logs["cosine_similarity"].item() == pytest.approx(
        cosreg_double_loop(rows.detach(), 1.0) * m**2 / (m * (m - 1)), rel=1e-5)


@pytest.mark.parametrize("make_penalty", [
    lambda s, m: istar_penalty(s, m, lam=1.0, zeta=0.2, sigma_s=torch.eye(5, dtype=torch.float64)),
    lambda s, m: istar_penalty(s, m, lam=-1.0, zeta=0.0, sigma_s=None, layers="all+embeddings"),
    lambda s, m: cosreg_penalty(s, m, lam=1.0),
])
def test_padding_positions_change_neither_value_nor_gradient(make_penalty):
    mask = padded_mask([7, 3, 5])
    clean = random_hidden_states(seed=4)
    g = torch.Generator().manual_seed(99)
    noisy = tuple((s.detach() + 100 * torch.randn(s.shape, dtype=s.dtype, generator=g) * (1 - mask[..., None])).requires_grad_()
                  for s in clean)
    a, b = make_penalty(clean, mask), make_penalty(noisy, mask)
    assert a.term.item() == pytest.approx(b.term.item(), rel=1e-9)
    a.term.backward()
    b.term.backward()
    for s_clean, s_noisy in zip(clean, noisy):
        if s_clean.grad is not None:
            torch.testing.assert_close(s_clean.grad, s_noisy.grad)
            assert (s_clean.grad[~mask.bool()] == 0).all()


def test_penalties_on_a_real_model(tiny_bert):
    ids = torch.randint(0, 100, (4, 12))
    mask = padded_mask([12, 9, 12, 4], length=12)
    out = tiny_bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert len(out.hidden_states) == 4
    sigma_s = torch.eye(16)
    total = (istar_penalty(out.hidden_states, mask, lam=-1.0, zeta=0.2, sigma_s=sigma_s).term
             + cosreg_penalty(out.hidden_states, mask).term)
    total.backward()
    grads = [p.grad for p in tiny_bert.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_cosreg_needs_two_tokens():
    states = random_hidden_states()
    with pytest.raises(ValueError, match="at least 2 token rows"):
        cosreg_penalty(states, padded_mask([1, 0, 0]))


def numpy_isoscore_star(rows: np.ndarray, zeta: float, sigma_s: np.ndarray) -> float:
    """IsoScore* from NumPy's covariance of the rows and eigenvalues (docs/method.md §1–2), independently of istar."""
    shrunk = (1 - zeta) * np.cov(rows.T) + zeta * sigma_s
    eig = np.linalg.eigvalsh(shrunk)
    d = len(eig)
    normalised = np.sqrt(d) * eig / np.linalg.norm(eig)
    delta = np.linalg.norm(normalised - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    phi = (d - delta**2 * (d - np.sqrt(d))) ** 2 / d**2
    return (d * phi - 1) / (d - 1)


@pytest.mark.parametrize("tokens", ["real", "all_positions"])
def test_penalty_rows_are_numpy_covariance_over_the_selected_positions(tokens):
    """all_positions: every (b, t) of the padded batch, padding included; real: the masked ones only."""
    states = random_hidden_states(num_layers=3, batch=4, length=9, dim=6, seed=11)
    mask = padded_mask([9, 2, 5, 7], length=9)
    sigma_s = np.cov(np.random.default_rng(0).normal(size=(400, 6)).T)
    layered = np.stack([s.detach().numpy() for s in states[1:]])  # (L, B, T, d)
    chosen = mask.numpy().astype(bool) if tokens == "real" else np.ones(mask.shape, dtype=bool)
    expected_rows = layered[:, chosen].reshape(-1, 6)  # (L · M, d)
    assert expected_rows.shape[0] == 3 * (23 if tokens == "real" else 36)

    rows = token_rows(states, mask, "all", tokens)
    np.testing.assert_allclose(np.cov(rows.detach().numpy().T), np.cov(expected_rows.T), rtol=1e-12)
    penalty = istar_penalty(states, mask, lam=-1.0, zeta=0.4, sigma_s=torch.from_numpy(sigma_s), tokens=tokens)
    assert penalty.logs["isoscore_star"].item() == pytest.approx(numpy_isoscore_star(expected_rows, 0.4, sigma_s),
                                                                 rel=1e-9)
    assert penalty.logs["penalty_rows"].item() == expected_rows.shape[0]
    penalty.term.backward()
    padding = ~mask.bool()
    # padded positions get a gradient exactly when they are rows
    assert all(bool((s.grad[padding] != 0).any()) == (tokens == "all_positions") for s in states[1:])

    last = layered[-1][chosen]
    cos = cosreg_penalty(states, mask, lam=1.0, tokens=tokens)
    assert cos.term.item() == pytest.approx(cosreg_double_loop(torch.from_numpy(last), 1.0), rel=1e-5)  # float32 sums
    assert cos.logs["penalty_rows"].item() == last.shape[0]


def test_unknown_token_selection_is_named():
    states = random_hidden_states()
    with pytest.raises(ValueError, match="unknown token selection 'pads'.*real, all_positions"):
        token_rows(states, padded_mask([7, 3, 1]), "all", "pads")
