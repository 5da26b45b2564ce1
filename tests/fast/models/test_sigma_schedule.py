"""Σ_S's per-epoch rule, :class:`istar.models.shrinkage.SigmaSchedule`: the one schedule `istar train`
(istar.steps.sigma_tracking) and the library's integrations (istar.integrations.config) follow."""

from __future__ import annotations

import torch

from istar.integrations.config import IStarConfig
from istar.integrations.config import SigmaSchedule as ConfigSchedule
from istar.models.shrinkage import SigmaSchedule


def counting():
    """A Σ_S pass stand-in that returns the number of passes so far as a (2, 2) matrix, and the pass count."""
    passes = []

    def compute():
        passes.append(len(passes) + 1)
        return torch.full((2, 2), float(len(passes)), dtype=torch.float64)

    return compute, passes


def test_the_first_epoch_takes_the_given_sigma_and_later_ones_a_new_one_only_when_recomputing():
    compute, passes = counting()
    given = torch.eye(2, dtype=torch.float64)
    every = SigmaSchedule(needed=True, recompute=True)
    assert every.advance(0, compute, given=lambda: given) is given and passes == []
    assert every.advance(0, compute) is None  # an epoch's start is not set twice
    assert torch.equal(every.advance(1, compute), torch.ones(2, 2, dtype=torch.float64)) and every.sigma_epoch == 1

    kept = SigmaSchedule(needed=True, recompute=False)
    assert torch.equal(kept.advance(0, compute, given=lambda: None), torch.full((2, 2), 2.0, dtype=torch.float64))
    assert kept.advance(1, compute) is None and not kept.due(2) and kept.sigma_epoch == 0
    assert torch.equal(kept.sigma_s, torch.full((2, 2), 2.0, dtype=torch.float64))

    unread = SigmaSchedule(needed=False, recompute=True)
    assert unread.advance(0, compute) is None and unread.sigma_s is None and unread.sigma_epoch == 0
    assert passes == [1, 2]


def test_the_integrations_follow_the_same_rule_with_a_configs_settings():
    fixed = ConfigSchedule(IStarConfig(lam=-1.0, zeta=0.2, recompute_shrinkage=False))
    assert isinstance(fixed, SigmaSchedule) and (fixed.needed, fixed.recompute) == (True, False)
    assert not ConfigSchedule(IStarConfig(lam=-1.0, zeta=0.0)).needed  # ζ = 0 reads no Σ_S
    assert not ConfigSchedule(IStarConfig(method="cosreg")).needed
