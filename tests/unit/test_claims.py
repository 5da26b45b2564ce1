"""The claims table: each verdict follows from the tests the tables print, on synthetic aggregates."""

import numpy as np
import pandas as pd
import pytest

from istar.report.claims import CLAIMS, claims_table
from istar.report.tables import seed_table

RNG = np.random.default_rng(3)


def _runs(istar_gain: float, seeds: int = 12, cosreg: bool = True, isoscore_drop: float = 0.05) -> pd.DataFrame:
    rows = []
    for task in ("sst2", "mrpc"):
        for seed in range(seeds):
            base = 0.80 + RNG.normal(0, 0.01)
            arms = [("base", 0.0, np.nan, "real", base, 0.20, 0.50),
                    ("istar", -1.0, 0.2, "all_positions", base + istar_gain + RNG.normal(0, 0.005),
                     0.20 - isoscore_drop + RNG.normal(0, 0.002), 0.55)]
            if cosreg:
                arms.append(("cosreg", 1.0, np.nan, "real", base + RNG.normal(0, 0.005), 0.20 + RNG.normal(0, 0.002),
                             0.10 + RNG.normal(0, 0.01)))
            for method, lam, zeta, tokens, score, iso, cosine in arms:
                rows.append({"study": "final", "model": "m", "task": task, "method": method, "lam": lam, "zeta": zeta,
                             "tokens": tokens, "seed": seed, "metric": "accuracy", "score": score,
                             "isoscore_star": iso, "cosine_similarity": cosine, "standin": False})
    return pd.DataFrame(rows)


def _verdicts(table) -> dict[str, list[str]]:
    by_claim: dict[str, list[str]] = {}
    statements = {claim.statement: claim.key for claim in CLAIMS}
    for (statement,), (_, _, verdict) in zip(table.index, table.cells):
        by_claim.setdefault(statements[statement], []).append(verdict)
    return by_claim


def test_a_clear_gain_is_supported_and_a_clear_loss_contradicted():
    assert _verdicts(claims_table(_runs(+0.02)))["istar_beats_base"] == ["supported"]
    assert _verdicts(claims_table(_runs(-0.02)))["istar_beats_base"] == ["contradicted"]


def test_no_effect_is_inconclusive_and_names_what_it_could_have_detected():
    (verdict,) = _verdicts(claims_table(_runs(0.0, seeds=3)))["istar_beats_base"]
    assert verdict.startswith("inconclusive: it could have detected") and "points or more (80% power)" in verdict


def test_mechanism_claims_and_what_is_not_tested():
    verdicts = _verdicts(claims_table(_runs(+0.02)))
    assert verdicts["istar_lowers_isoscore"] == ["supported"]
    assert verdicts["cosreg_not_isotropic"][0].startswith("supported")  # cosine 0.5 → 0.1, IsoScore* unchanged
    # λ < 0 lowered IsoScore* and the score rose: decreasing isotropy helped here
    assert verdicts["decreasing_isotropy_helps"] == ["supported", "supported"]  # a row per task
    assert verdicts["negative_lambda"] == ["not tested"] and verdicts["stable_on_mini_batches"] == ["not tested"]
    verdicts = _verdicts(claims_table(_runs(+0.02, cosreg=False, isoscore_drop=0.0)))
    assert verdicts["cosreg_not_isotropic"] == ["not tested"]
    assert verdicts["decreasing_isotropy_helps"][0].startswith("not tested: this variant did not lower")


def test_the_search_protocol_and_the_simulation_enter_when_present():
    selection = pd.DataFrame({"model": ["m", "m"], "task": ["sst2", "mrpc"], "lam": [-1.0, 1.0], "seeds": [1, 1],
                              "protocol": ["validation", "validation"]})
    stability = pd.DataFrame({"batch_size": [64, 64, 131072, 131072], "zeta": [0.0, 0.2, 0.0, 0.2],
                              "mean": [0.30, 0.52, 0.55, 0.55], "std": [0.01] * 4})
    table = claims_table(_runs(+0.02), selection, stability)
    verdicts = _verdicts(table)
    assert verdicts["negative_lambda"] == ["contradicted in 1 cell(s)"]
    assert verdicts["stable_on_mini_batches"] == ["supported"]
    numbers = {statement: cells[1] for (statement,), cells in zip(table.index, table.cells)}
    assert any("one seed per setting" in text for text in numbers.values())
    fixed = selection.assign(protocol="fixed")
    assert _verdicts(claims_table(_runs(+0.02), fixed))["negative_lambda"] == ["not tested"]


def test_the_seed_table_lists_every_run_and_its_paired_difference():
    runs = _runs(+0.02, seeds=2)
    table = seed_table(runs)
    assert table.columns == ["Base", "CosReg", "I-STAR", "CosReg − Base", "I-STAR − Base"]
    assert len(table.index) == 4 and table.index[0] == ["m", "SST-2", "0"]
    first = runs[(runs.task == "sst2") & (runs.seed == 0)].set_index("method")["score"] * 100
    assert table.cells[0][0] == f"{first['base']:.1f}"
    assert table.cells[0][4] == f"{first['istar'] - first['base']:+.1f}"
    with pytest.raises(ValueError, match="no rows with study == 'final'"):
        seed_table(runs.assign(study="search"))
