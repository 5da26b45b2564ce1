"""The selection protocols as the planner sees them: λ | ζ fixed in advance, the final stage's methods
and seeds, the padding study's own tuning, and an equal tuning budget for the baselines."""

import pytest

from istar.config.layout import Setting
from istar.config.schema import ConfigError
from istar.pipeline.plan import (baseline_choices, final_settings, fixed_choice_args, fixed_setting, search_settings,
                                 study_runs, study_seeds, tuned_setting, tuning_settings)
from istar.pipeline.validate import validate_config
from istar.report.select import fixed_choice

FIXED = {"models": {"m": "package:x/y"}, "tasks": ["sst2", "mrpc"],
         "penalty": {"tokens": "all_positions"},
         "final": {"methods": ["base", "istar"], "istar": {"m": {"sst2": {"lam": -5, "zeta": 0.6}}}}}


def test_a_fixed_pair_has_its_setting_from_the_config_and_the_other_is_searched():
    config = validate_config(FIXED, check_paths=False)
    fixed = fixed_setting(config, "m", "sst2")
    assert fixed == Setting("istar", lam=-5.0, zeta=0.6, tokens="all_positions")
    assert fixed.name == "istar_lam-5_zeta0.6_allpos" and fixed_setting(config, "m", "mrpc") is None
    # final.methods without CosReg: Base and the fixed I-STAR setting
    assert final_settings(config, fixed) == [Setting("base"), fixed]
    args = fixed_choice_args(config, "m", "sst2")
    best = fixed_choice(**args)
    assert best["protocol"] == "fixed" and best["settings"] == 0 and best["candidates"] == []
    assert (best["lam"], best["zeta"], best["tokens"], best["metric"]) == (-5.0, 0.6, "all_positions", "accuracy")


@pytest.mark.parametrize("change, key", [
    ({"final": {"istar": {"other": {"sst2": {"lam": -1, "zeta": 0.2}}}}}, "final.istar.other"),
    ({"final": {"istar": {"m": {"rte": {"lam": -1, "zeta": 0.2}}}}}, "final.istar.m.rte"),
    ({"final": {"istar": {"m": {"sst2": {"lam": 0, "zeta": 0.2}}}}}, "final.istar.m.sst2.lam"),
    ({"final": {"istar": {"m": {"sst2": {"lam": -1}}}}}, "final.istar.m.sst2"),
    ({"final": {"methods": ["cosreg", "istar"]}}, "final.methods"),
    ({"final": {"seeds_by_task": {"rte": [0]}}}, "final.seeds_by_task.rte"),
    ({"studies": {"padding": {"lam": "tuned"}}}, "studies.padding.lam"),
    ({"search": {"tune_baselines": True}}, "search.tune_baselines"),
])
def test_invalid_protocol_settings_name_their_key(change, key):
    config = {"models": {"m": "package:x/y"}, "tasks": ["sst2", "mrpc"], **change}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(config, check_paths=False)


def test_seeds_by_task_give_a_task_its_own_seeds_and_studies_follow():
    config = validate_config({**FIXED, "final": {**FIXED["final"], "seeds": [0, 1, 2], "seeds_by_task": {"mrpc": [7]}},
                              "studies": {"padding": {"enabled": True}}}, check_paths=False)
    assert study_seeds(config, "final", "sst2") == [0, 1, 2] and study_seeds(config, "final", "mrpc") == [7]
    selected = fixed_setting(config, "m", "sst2")
    runs = study_runs(config, "padding", "m", "mrpc", selected)
    assert {seed for _, seed in runs} == {7}


def test_the_padding_study_tunes_its_other_variant_on_its_own_grid():
    config = validate_config({**FIXED, "studies": {"padding": {
        "enabled": True, "lam": "tuned", "zeta": "tuned", "tuning": {"lambdas": [-1, -3], "zetas": [0.2], "seeds": [5]}}}},
        check_paths=False)
    grid = tuning_settings(config)
    assert [s.name for s in grid] == ["istar_lam-1_zeta0.2", "istar_lam-3_zeta0.2"]  # real tokens: not penalty.tokens
    selected = fixed_setting(config, "m", "sst2")
    assert study_runs(config, "padding", "m", "sst2", selected) is None  # waits for its own choice
    tuned = tuned_setting({"lam": -3.0, "zeta": 0.2, "tokens": "real"})
    runs = study_runs(config, "padding", "m", "sst2", selected, tuned=tuned)
    assert sorted({s.name for s, _ in runs}) == ["base", "istar_lam-3_zeta0.2", "istar_lam-5_zeta0.6_allpos"]


def test_an_equal_tuning_budget_searches_the_baselines_on_the_same_grid():
    grid = {"batch_sizes": [16, 32], "epochs": [3], "learning_rates": [3e-5]}
    config = validate_config({"models": {"m": "package:x/y"}, "tasks": ["rte"],
                              "search": {"lambdas": [-1], "zetas": [0.2], "tune_baselines": True, **grid}},
                             check_paths=False)
    names = [s.name for s in search_settings(config, "m", "rte")]
    assert names == ["istar_lam-1_zeta0.2_bs16_ep3_lr3e-05", "istar_lam-1_zeta0.2_bs32_ep3_lr3e-05",
                     "base_bs16_ep3_lr3e-05", "base_bs32_ep3_lr3e-05",
                     "cosreg_lam1_bs16_ep3_lr3e-05", "cosreg_lam1_bs32_ep3_lr3e-05"]
    chosen = Setting("istar", lam=-1.0, zeta=0.2, batch_size=32, epochs=3, learning_rate=3e-5)
    baselines = baseline_choices({"baselines": {
        "base": {"lam": 0.0, "tokens": "real", "batch_size": 16, "epochs": 3, "learning_rate": 3e-5},
        "cosreg": {"lam": 1.0, "tokens": "real", "batch_size": 32, "epochs": 3, "learning_rate": 3e-5}}})
    assert [s.name for s in final_settings(config, chosen, baselines)] == [
        "base_bs16_ep3_lr3e-05", "cosreg_lam1_bs32_ep3_lr3e-05", "istar_lam-1_zeta0.2_bs32_ep3_lr3e-05"]
    # the paper's protocol: the baselines inherit I-STAR's training values
    assert [s.name for s in final_settings(config, chosen, {})][0] == "base_bs32_ep3_lr3e-05"
    # before the search that tunes them has run, no baseline is planned (none at I-STAR's values)
    assert final_settings(config, chosen) == [chosen]


def test_a_fixed_istar_can_face_baselines_tuned_on_heldout_rows():
    """final.istar with search.tune_baselines: the search trains only the baselines, over the training
    grid on held-out rows; the fixed I-STAR is planned at once, each baseline once its search has chosen."""
    config = validate_config({**FIXED, "search": {"tune_baselines": True, "selection_split": "heldout",
                                                  "batch_sizes": [32], "epochs": [3], "learning_rates": [2e-5, 5e-5]}},
                             check_paths=False)
    assert [s.name for s in search_settings(config, "m", "sst2")] == ["base_bs32_ep3_lr2e-05", "base_bs32_ep3_lr5e-05"]
    assert len(search_settings(config, "m", "mrpc")) == 2 * 4 * 6 + 2  # the searched pair: I-STAR's grid and Base's
    fixed = fixed_setting(config, "m", "sst2")
    assert final_settings(config, fixed) == [fixed]
    tuned = baseline_choices({"baselines": {"base": {"lam": 0.0, "tokens": "real", "batch_size": 32, "epochs": 3,
                                                     "learning_rate": 2e-5}}})
    assert [s.name for s in final_settings(config, fixed, tuned)] == ["base_bs32_ep3_lr2e-05", fixed.name]
    without = validate_config(FIXED, check_paths=False)
    assert search_settings(without, "m", "sst2") == []  # the confirmatory protocol alone searches nothing
