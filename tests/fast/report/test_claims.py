"""The claims table: each verdict follows from the tests the tables print, on synthetic aggregates."""

import math

import numpy as np
import pandas as pd
import pytest

from istar.report.claims import CLAIMS, claims_table
from istar.report.comparisons import study_tests
from istar.report.paper import Estimate
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
    assert verdicts["decreasing_isotropy_helps"][0].startswith("not tested: I-STAR did not lower IsoScore*")


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


def _cells(table, key: str) -> list[list[str]]:
    statements = {claim.statement: claim.key for claim in CLAIMS}
    return [cells for (statement,), cells in zip(table.index, table.cells) if statements[statement] == key]


def test_a_declared_primary_endpoint_judges_the_claim_with_the_familys_one_holm_value():
    runs = _runs(-0.012, seeds=8)
    config = {"inference": {"primary": {"model": "m", "task": "sst2", "contrast": "istar"}, "paper_models": {}},
              "data": {"max_train_samples": 3000}}
    table = claims_table(runs, config=config)
    ((scope, numbers, verdict),) = _cells(table, "istar_beats_base")
    assert scope.startswith("m SST-2, 3,000 training rows") and "declared primary endpoint" in scope
    # 8 pairs: the rank test's smallest p, 0.0078, cannot pass α / m, and the verdict says so
    assert verdict.startswith("contradicted; the signed-rank test cannot pass at this level: with 8 pairs")
    primary = study_tests(runs).rows("final").query("task == 'sst2' and method == 'istar'").iloc[0]
    holm_text = f"Holm p = {'<0.001' if primary.p_holm < 0.001 else f'{primary.p_holm:.3f}'}"
    assert holm_text in numbers and "signed-rank p" in numbers
    # the same comparison in another claim carries the same adjusted p and the same verdict
    (sst2,) = [cells for cells in _cells(table, "decreasing_isotropy_helps") if "SST-2" in cells[0]]
    assert holm_text in sst2[1] and sst2[2] == verdict
    # without a declaration the claim is judged on the pool of the two cells (HKSJ below five)
    ((_, pooled, _),) = _cells(claims_table(runs), "istar_beats_base")
    assert "Hartung–Knapp–Sidik–Jonkman" in pooled


def test_one_informative_cell_is_not_called_pooled_and_no_information_claims_no_power():
    runs = _runs(+0.02, seeds=6)
    mrpc = (runs["task"] == "mrpc") & runs["method"].isin(["base", "istar"])
    runs.loc[mrpc, "score"] = 0.684  # every run of both arms collapsed to the majority class
    ((scope, numbers, verdict),) = _cells(claims_table(runs), "istar_beats_base")
    assert "pooled" not in scope and scope.startswith("m SST-2") and verdict.startswith("supported")
    only = runs[runs["task"] == "mrpc"]
    ((_, numbers, verdict),) = _cells(claims_table(only), "istar_beats_base")
    assert verdict.startswith("not informative") and "could have detected" not in verdict


def test_the_trend_across_the_lambda_sweep_is_the_claim_of_decreasing_isotropy():
    rows = []
    for seed in range(8):
        offset = RNG.normal(0, 0.01)
        for lam in (-5, -3, -1, 0, 1, 3, 5):
            iso = 0.20 + 0.02 * lam + RNG.normal(0, 0.005)
            rows.append({"study": "lambda_sweep", "model": "m", "task": "sst2",
                         "method": "base" if lam == 0 else "istar", "lam": float(lam), "zeta": 0.6 if lam else np.nan,
                         "tokens": "all_positions", "seed": seed, "metric": "accuracy",
                         "score": 0.80 - 0.5 * (iso - 0.2) + offset + RNG.normal(0, 0.003), "isoscore_star": iso,
                         "cosine_similarity": 0.3, "standin": False})
    runs = pd.concat([_runs(0.0, seeds=8), pd.DataFrame(rows)], ignore_index=True)
    config = {"inference": {"primary": {"model": "m", "task": "sst2", "contrast": "lambda_sweep"}}}
    ((scope, numbers, verdict),) = _cells(claims_table(runs, config=config), "decreasing_isotropy_helps")
    assert "the λ sweep at ζ = 0.6 (the declared primary endpoint)" in scope
    assert verdict == "supported" and "per +0.1" in numbers and "on λ" in numbers and "8 seeds" in numbers
    assert "the causal contrast" in numbers and "across λ" in numbers and "with λ as the instrument" in numbers
    # the claim judged on the declared primary opens the table; the others keep their order
    statements = [statement for (statement,) in claims_table(runs, config=config).index]
    first = next(claim for claim in CLAIMS if claim.key == "decreasing_isotropy_helps").statement
    assert statements[0] == first and [s for s in dict.fromkeys(statements) if s != first] == \
        [claim.statement for claim in CLAIMS if claim.statement != first]
    flat = pd.DataFrame(rows).assign(isoscore_star=lambda f: 0.20 - 0.02 * f["lam"] + RNG.normal(0, 0.005, len(f)))
    runs = pd.concat([_runs(0.0, seeds=8), flat], ignore_index=True)
    ((_, _, verdict),) = _cells(claims_table(runs, config=config), "decreasing_isotropy_helps")
    assert verdict == "contradicted"  # here the score rose with IsoScore*


def test_the_papers_own_cell_is_set_beside_ours():
    runs = _runs(+0.001, seeds=8).replace({"model": {"m": "minilm"}})
    ((_, numbers, _),) = _cells(claims_table(runs), "istar_beats_base")
    # DistilBERT's Table 1: SST-2 91.42 ± 0.11 vs 91.36 ± 0.15 (n = 5): +0.06, Welch p = 0.49
    assert "the paper's distilbert SST-2: +0.06" in numbers and "(p = 0.493)" in numbers
    assert "the paper's distilbert MRPC: +0.49" in numbers and "(p = 0.077)" in numbers
    assert ": not distinguishable; it could detect a gap of" in numbers and "(minilm and distilbert)" in numbers


def test_the_rank_test_is_judged_at_the_verdicts_level():
    """The dose-response records (docs/data): 8 seeds in a family of 8; every IsoScore* comparison has all
    8 seeds on one side (signed-rank p 0.0078), which Holm's first step at 0.00625 cannot take."""
    from pathlib import Path

    runs = pd.read_csv(Path(__file__).parents[3] / "docs" / "data" / "dose-response" / "runs.csv")
    ((_, numbers, verdict),) = _cells(claims_table(runs), "istar_lowers_isoscore")
    assert verdict.startswith("supported; the signed-rank test cannot pass at this level: with 8 pairs its smallest "
                              "p is 0.0078, not below its verdict's level 0.0063 (it needs 9 pairs)")
    assert "signed-rank p = 0.008" in numbers and "(signed-rank p = 0.062; family of 8, its level 0.0063)" in numbers
    # beside the paper's own cell, the gap test's power at its level (the paper's own gain is +0.06)
    ((_, numbers, _),) = _cells(claims_table(runs), "istar_beats_base")
    assert ("ours − the paper's -0.50 [-1.54, +0.54] (95%): not distinguishable; it could detect a gap of 1.44 "
            "points or more (80% power)") in numbers
    # with 12 seeds the rank test can reach the family's level and agrees with the t-test: no note
    (verdict,) = _verdicts(claims_table(_runs(+0.02)))["istar_lowers_isoscore"]
    assert verdict == "supported"


def test_cosregs_claim_is_judged_in_three_parts_on_the_last_layer():
    runs = _runs(+0.02)
    final_base = runs["method"] == "base"
    # the last layer: CosReg leaves its IsoScore* where Base has it (0.01, as the paper's 0.004–0.007)
    runs["last_layer_isoscore_star"] = 0.01 + RNG.normal(0, 0.002, len(runs))
    lowered, unchanged, *own = _cells(claims_table(runs), "cosreg_not_isotropic")
    assert lowered[0].startswith("the cosine lowered: 2 cells pooled") and lowered[2] == "supported"
    assert unchanged[0].startswith("isotropy unchanged") and "CosReg − Base last-layer IsoScore*" in unchanged[1]
    assert unchanged[2].startswith("supported as far as the test sees: not distinguishable from Base; it could have "
                                   "detected")
    assert [cells[2] for cells in own] == ["supported", "supported"]  # a row per task, far below 1
    assert "CosReg's last-layer IsoScore* 0.010" in own[0][1]
    # CosReg raising the last layer's IsoScore* to 0.9: changed against Base and made isotropic
    runs.loc[runs["method"] == "cosreg", "last_layer_isoscore_star"] = 0.9 + RNG.normal(0, 0.002, (~final_base).sum() // 2)
    _, unchanged, *own = _cells(claims_table(runs), "cosreg_not_isotropic")
    assert unchanged[2] == "contradicted: CosReg changed it" and [cells[2] for cells in own] == ["contradicted"] * 2
    # the records without the last layer (runs.csv before the column): that part is not tested
    _, last = _cells(claims_table(runs.drop(columns="last_layer_isoscore_star")), "cosreg_not_isotropic")
    assert last[2] == "not tested"


def test_gatekeeping_tests_the_primary_at_alpha_and_prints_the_plan():
    runs = _runs(-0.012, seeds=8)
    primary = {"model": "m", "task": "sst2", "contrast": "istar"}
    family = study_tests(runs, {"primary": primary})
    gated = study_tests(runs, {"primary": primary, "multiplicity": "gatekeeping"})
    pick = "study == 'final' and measure == 'score' and task == 'sst2' and method == 'istar'"
    (first,), (alone,) = (tests.paired.query(pick).itertuples() for tests in (family, gated))
    assert alone.p_holm == alone.p_value
    assert alone.mde_alpha == pytest.approx(0.05) and first.mde_alpha == pytest.approx(0.05 / first.family_size)
    assert alone.mde < first.mde  # the primary at α detects less than at α / m
    secondaries = gated.paired.drop(gated.paired.query(pick).index).dropna(subset=["p_value"])
    assert (secondaries["p_holm"] >= alone.p_value).all()
    assert secondaries["mde_alpha"].tolist() == pytest.approx([0.05 / (first.family_size - 1)] * len(secondaries))
    table = claims_table(runs, config={"inference": {"primary": primary, "multiplicity": "gatekeeping"}})
    assert table.footnotes[0].startswith("Multiplicity (inference.multiplicity): gatekeeping, the primary alone, the "
                                         "secondaries (Holm among them) only if it passes; the primary tested at 0.0500")
    ((_, numbers, _),) = _cells(table, "istar_beats_base")
    assert "first-step level" not in numbers  # the primary's 95 % interval is its verdict's
    ((_, numbers, _),) = _cells(claims_table(runs, config={"inference": {"primary": primary}}), "istar_beats_base")
    strict = Estimate.of(first.mean_difference * 100, first.sd_difference * 100 / math.sqrt(8), 7, first.mde_alpha)
    assert f"[{strict.ci_low:+.2f}, {strict.ci_high:+.2f}] at Holm's first-step level ({1 - first.mde_alpha:.1%})" in numbers
