"""The results layout (istar.config.layout): every path is formatted and read back by one grammar."""

import re

import pytest

from istar.config.layout import (
    MEASURES,
    RUN,
    SEARCH_RUN,
    WILDCARD_CONSTRAINTS,
    Setting,
    parse_run_dir,
    seed_of,
    seeds_token,
)


@pytest.mark.parametrize("setting", [Setting("base"), Setting("cosreg", lam=1.0), Setting("istar", lam=-1.0, zeta=0.2),
                                     Setting("istar", lam=-0.5, zeta=0.8, layer=6),
                                     Setting("istar", lam=1.0, zeta=0.0, batch_size=16, epochs=3, learning_rate=3e-5),
                                     Setting("istar", lam=-1.0, zeta=0.2, tokens="all_positions"),
                                     Setting("cosreg", lam=1.0, tokens="all_positions"),
                                     Setting("istar", lam=-1.0, zeta=0.2, layer=3, tokens="all_positions", batch_size=16,
                                             epochs=3, learning_rate=3e-5)])
def test_a_run_folder_reads_back_as_it_was_written(setting):
    for template in (RUN, SEARCH_RUN):
        path = template.format(model="bert", task="rte", setting=setting.name, seed=4)
        parsed = parse_run_dir(path)
        assert (parsed.model, parsed.task, parsed.seed) == ("bert", "rte", 4)
        assert Setting.parse(parsed.setting) == setting
        assert re.fullmatch(WILDCARD_CONSTRAINTS["setting"], parsed.setting)


def test_folders_outside_the_layout():
    assert parse_run_dir("runs/base") is None and parse_run_dir("a/b/c/base/seedX") is None
    assert seed_of("seed12") == 12 and seed_of("seeds0_1") is None


def test_measurement_files_name_their_distinct_seeds_in_order():
    assert seeds_token([2, 0, 1, 0]) == "0_1_2"
    path = MEASURES.format(model="m", task="rte", setting="base", seeds=seeds_token([3, 1]))
    assert path == "results/measures/m/rte/base/seeds1_3.json"
    assert re.fullmatch(WILDCARD_CONSTRAINTS["seeds"], seeds_token([3, 1]))


def test_the_token_selection_is_spelled_only_when_it_is_not_the_default():
    from istar.config.layout import SIGMA, SIGMA_ALL_POSITIONS

    assert Setting("istar", lam=-1.0, zeta=0.2).name == "istar_lam-1_zeta0.2"  # existing results keep their paths
    assert Setting("istar", lam=-1.0, zeta=0.2, tokens="all_positions").name == "istar_lam-1_zeta0.2_allpos"
    assert Setting("cosreg", lam=1.0, tokens="all_positions").name == "cosreg_lam1_allpos"
    assert Setting("base").name == "base"  # no penalty: nothing to select
    assert SIGMA.endswith("/sigma0.pt") and SIGMA_ALL_POSITIONS.endswith("/sigma0_allpos.pt")
    with pytest.raises(ValueError, match="canonical form"):
        Setting.parse("base_allpos")
