"""The held-out selection protocol (search.selection_split: heldout): the schema, the paths it
decides and the cut of the training split (the workflow run: tests/e2e/test_heldout_selection.py)."""

import pytest
from mirrors import FULL_MIRROR

from istar.config.layout import DATA, SEARCH_RUN, SIGMA, search_templates
from istar.config.schema import ConfigError, load_schema
from istar.data import read_meta, read_split
from istar.data.holdout import GROUPINGS, heldout_overlap, holdout_split
from istar.pipeline.plan import heldout_name, holdout_spec
from istar.pipeline.validate import validate_config
from istar.report.select import PROTOCOLS


def test_the_schema_offers_exactly_the_registered_protocols():
    search = load_schema()["properties"]["search"]["properties"]
    # the two splits a search can be scored on, and the protocol with no search (final.istar)
    assert search["selection_split"]["enum"] + ["fixed"] == list(PROTOCOLS)
    assert "istar" in load_schema()["properties"]["final"]["properties"]
    assert search["selection_split"]["default"] == "validation"  # the paper's protocol stays the default


def test_the_protocol_decides_the_search_paths():
    default = validate_config({}, check_paths=False)
    assert heldout_name(default) is None and search_templates(None) == (DATA, SIGMA, SEARCH_RUN)
    heldout = validate_config({"search": {"selection_split": "heldout"}}, check_paths=False)
    assert (heldout["search"]["heldout_fraction"], heldout["search"]["heldout_seed"]) == (0.2, 0)
    assert heldout_name(heldout) == "heldout0.2_seed0"
    assert search_templates("heldout0.2_seed0") == (
        "resources/data/{task}/heldout0.2_seed0",
        "resources/shrinkage/{model}/{task}/heldout0.2_seed0/sigma0.pt",
        "results/search/heldout0.2_seed0/{model}/{task}/{setting}/seed{seed}")
    spec = holdout_spec(heldout, data_dir="resources/data/rte", out="resources/data/rte/heldout0.2_seed0")
    assert (spec.fraction, spec.seed) == (0.2, 0)
    with pytest.raises(ConfigError, match="search.heldout_fraction"):
        validate_config({"search": {"selection_split": "heldout", "heldout_fraction": 0.7}}, check_paths=False)
    with pytest.raises(ConfigError, match="search.selection_split"):
        validate_config({"search": {"selection_split": "test"}}, check_paths=False)


def test_holdout_split_is_a_seeded_disjoint_cut_of_the_training_rows(prepared, tmp_path):
    data = prepared("rte", 48, 24)
    meta = holdout_split(data, tmp_path / "a", fraction=0.25, seed=0)
    train, held = read_split(tmp_path / "a", "train"), read_split(tmp_path / "a", "validation")
    full = read_split(data, "train")
    assert len(held) == 12 and len(train) == 36
    assert set(train["idx"]).isdisjoint(held["idx"])
    assert sorted([*train["idx"], *held["idx"]]) == sorted(full["idx"])
    # the held-out rows are training rows, never the validation rows the tables report
    assert set(held["idx"]) <= set(full["idx"]) and list(train["idx"]) == sorted(train["idx"])
    # RTE's 48 pairs here share no sentence, so each is its own component
    assert meta["heldout"] == {"of": str(data), "of_train_sha256": read_meta(data)["split_sha256"]["train.parquet"],
                               "fraction": 0.25, "seed": 0, "grouping": "shared_sentence", "unit": "component",
                               "held_out": 12, "units": 48, "rows": {"held_out": 12, "search_train": 36, "dropped": 0},
                               "overlap": {"measure": "held-out sentences that are a sentence of a training pair",
                                           "checked": 24, "found": 0, "share": 0.0}}
    assert read_meta(tmp_path / "a")["rows"] == {"train": 36, "validation": 12}
    same = holdout_split(data, tmp_path / "b", fraction=0.25, seed=0)
    other = holdout_split(data, tmp_path / "c", fraction=0.25, seed=1)
    assert same["heldout"] == meta["heldout"]
    assert read_split(tmp_path / "b", "validation")["idx"].tolist() == held["idx"].tolist()
    assert read_split(tmp_path / "c", "validation")["idx"].tolist() != held["idx"].tolist()
    assert other["heldout"]["seed"] == 1


def test_squad_is_held_out_by_article(prepared, tmp_path):
    data = prepared("squad", 60, 8)
    holdout_split(data, tmp_path / "q", fraction=0.3, seed=0)
    train, held = read_split(tmp_path / "q", "train"), read_split(tmp_path / "q", "validation")
    assert len(held) and set(train["title"]).isdisjoint(held["title"])
    assert sorted([*train["id"], *held["id"]]) == sorted(read_split(data, "train")["id"])


# ----------------------------------------------------------------------- groups, not rows


def _write_task(folder, task: str, train) -> str:
    """A prepared task folder whose training split is ``train`` (and whose validation split repeats it)."""
    from istar.data.storage import write_prepared
    from istar.registry.tasks import get_task

    write_prepared(folder, get_task(task), {"train": train, "validation": train}, {"task": task})
    return str(folder)


def _single(texts, labels=None):
    import pandas as pd

    return pd.DataFrame({"idx": range(len(texts)), "text_a": texts, "text_b": [None] * len(texts),
                         "label": labels if labels is not None else [i % 2 for i in range(len(texts))]})


PHRASES = ["the film is a mess . ", "the film", "a mess .", "i loved the film", "loved the film", "the film is",
           "film is a", "a  mess . ", "mess", "the films are good", "he"]
"""SST-2-like rows: three sentences (rows 0, 3 and 9) and phrases of them. "the film" is in the first two
sentences; "the films are good" holds no "the film" (whole tokens); row 7 is row 2 with other spaces."""


PHRASE_GROUPS = {0: [0], 1: [0, 1], 2: [0], 3: [1], 4: [1], 5: [0], 6: [0], 7: [0], 8: [0], 9: [2], 10: [3]}
"""The groups of each row of PHRASES: the sentences 0, 3, 9 and the lone "he" are groups 0, 1, 2, 3."""


def test_phrases_belong_to_every_sentence_that_contains_them_as_whole_tokens():
    members = GROUPINGS["source_sentence"].members(_single(PHRASES))
    assert members.count == 4  # the three sentences and "he", which no other row contains
    assert {row: sorted(members.groups[members.rows == row].tolist()) for row in PHRASE_GROUPS} == PHRASE_GROUPS


def test_a_phrase_of_a_held_out_and_a_kept_sentence_goes_to_neither_side(tmp_path):
    data = _write_task(tmp_path / "sst2", "sst2", _single(PHRASES))
    drawn = set()
    for seed in range(12):
        meta = holdout_split(data, tmp_path / f"h{seed}", fraction=0.25, seed=seed)  # one of the four groups
        held = read_split(tmp_path / f"h{seed}", "validation")["idx"].tolist()
        train = read_split(tmp_path / f"h{seed}", "train")["idx"].tolist()
        group = PHRASE_GROUPS[held[0]][0]
        drawn.add(group)
        assert held == [row for row, groups in PHRASE_GROUPS.items() if groups == [group]]
        assert train == [row for row, groups in PHRASE_GROUPS.items() if group not in groups]
        # "the film" (row 1) is in sentences 0 and 1: with either one held out, it is on neither side
        assert meta["heldout"]["rows"]["dropped"] == (1 if group in (0, 1) else 0)
        assert meta["heldout"]["overlap"]["found"] == 0
    assert drawn == {0, 1, 2, 3}


def test_pairs_that_share_a_sentence_stay_together():
    import pandas as pd

    pairs = pd.DataFrame({"idx": range(5), "label": [0, 1, 0, 1, 0],
                          "text_a": ["A cat sat.", "A dog ran.", "Rain fell.", "A  cat sat. ", "Snow."],
                          "text_b": ["A dog ran.", "Birds sang.", "It was wet.", "Mice hid.", "Ice."]})
    members = GROUPINGS["shared_sentence"].members(pairs)
    assert members.count == 3 and members.groups.tolist() == [0, 0, 1, 0, 2]


def test_every_task_names_a_registered_grouping():
    from istar.registry.tasks import TASKS

    assert {task.heldout_grouping for task in TASKS.values()} == set(GROUPINGS)


def test_the_overlap_measure_finds_whole_token_spans_of_five_words_or_more():
    from istar.registry.tasks import get_task

    train = _single(["i loved the film a lot", "the films are good and long"])
    held = _single(["i loved the film a", "loved the film", "the film are good and", "films are good and long"])
    overlap = heldout_overlap(train, held, get_task("sst2"))
    # "loved the film" is too short to count; "the film are good and" is no span of a training row
    assert (overlap["checked"], overlap["found"]) == (3, 2) and overlap["share"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("task", ["sst2", "qnli", "rte", "mrpc", "cola", "stsb", "sst5", "squad"])
def test_held_out_rows_share_nothing_with_the_search_rows_on_the_test_data(task, prepared, tmp_path):
    data = prepared(task, None, 24)  # every training row of the test data (QNLI, SQuAD: a stand-in)
    meta = holdout_split(data, tmp_path / "h", fraction=0.2, seed=0)
    train, held, full = (read_split(tmp_path / "h", "train"), read_split(tmp_path / "h", "validation"),
                         read_split(data, "train"))
    rows = meta["heldout"]["rows"]
    assert rows["held_out"] == len(held) > 0 and rows["search_train"] == len(train) > 0
    assert len(train) + len(held) + rows["dropped"] == len(full)
    assert meta["heldout"]["overlap"]["found"] == 0 and meta["heldout"]["overlap"]["checked"] > 0
    assert_no_shared_text(train, held)


def assert_no_shared_text(train, held):
    """The same check as heldout_overlap, written plainly (string search, sets): articles' paragraphs,
    pairs' sentences, and single sentences of 5+ words as whole-token spans."""
    def words(texts):
        return [" ".join(str(text).split()) for text in texts]

    if "context" in train:
        assert set(words(train["context"])).isdisjoint(words(held["context"]))
    elif train["text_b"].notna().all():
        assert (set(words(train["text_a"])) | set(words(train["text_b"]))).isdisjoint(
            set(words(held["text_a"])) | set(words(held["text_b"])))
    else:
        haystack = "\n".join(f" {text} " for text in words(train["text_a"]))
        inside = [text for text in words(held["text_a"]) if len(text.split()) >= 5 and f" {text} " in haystack]
        assert inside == []


@pytest.mark.full_release
@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_no_held_out_row_shares_a_sentence_with_the_search_rows_of_the_full_release(task, tmp_path):
    import time

    import numpy as np

    from istar.data import prepare_task
    from istar.registry.tasks import get_task

    prepare_task(task, tmp_path / task, source="mirror", mirror=FULL_MIRROR)
    started = time.perf_counter()
    meta = holdout_split(tmp_path / task, tmp_path / "h", fraction=0.2, seed=0)
    assert time.perf_counter() - started < 60  # SST-2's 67,349 rows: seconds (docs/method.md §6)
    train, held = read_split(tmp_path / "h", "train"), read_split(tmp_path / "h", "validation")
    assert meta["heldout"]["overlap"]["found"] == 0 and meta["heldout"]["overlap"]["checked"] > 1000
    assert_no_shared_text(train, held)
    # the measure sees the leak of a cut by row (docs/method.md §6: 80 % on SST-2, 6.5 % on MRPC)
    full = read_split(tmp_path / task, "train")
    by_row = np.zeros(len(full), dtype=bool)
    by_row[np.random.default_rng((0, 3)).choice(len(full), size=round(0.2 * len(full)), replace=False)] = True
    leak = heldout_overlap(full[~by_row], full[by_row], get_task(task))
    assert leak["share"] > {"sst2": 0.5, "mrpc": 0.03}[task]
