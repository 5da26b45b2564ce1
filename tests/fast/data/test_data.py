"""Tests of istar.data: mirror and hub loaders, stand-ins, subsampling, prepared folders, CLI."""

import json
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from data_helpers import break_file, squad_document, tiny_mirror
from mirrors import FULL_MIRROR, TEST_DATA

from istar.data import (
    MissingSplitError,
    load_task,
    prepare_task,
    read_meta,
    read_split,
    run_cli,
)
from istar.registry.tasks import TASKS


CLASSIFICATION_COLUMNS = ["idx", "text_a", "text_b", "label"]
QA_COLUMNS = ["id", "title", "context", "question", "answer_texts", "answer_starts"]

LAST_COLA_DEV = "John talked to Bill about himself."

# Rows (train, validation) of the public releases (their official sizes) and of the test data's slice
# (tests/data/README.md); QNLI and SQuAD: the dev split only.
FULL_ROWS = {
    "cola": (8551, 1043),
    "sst2": (67349, 872),
    "mrpc": (3668, 408),
    "rte": (2490, 277),
    "stsb": (5749, 1500),
    "sst5": (8544, 1101),
}
SLICE_ROWS = {task: (300, 100) for task in FULL_ROWS} | {"rte": (500, 100), "qnli": (None, 300),
                                                          "squad": (None, 327)}
BOTH = [pytest.param(TEST_DATA, SLICE_ROWS, id="test-data"),
        pytest.param(FULL_MIRROR, FULL_ROWS, id="full-release", marks=pytest.mark.full_release)]


@lru_cache(maxsize=None)
def _mirror_load(task, allow_standin=False, seed=0, mirror=TEST_DATA):
    # the test data holds a subset of each release on purpose; the full releases are checked against the official counts
    return load_task(task, source="mirror", mirror=mirror, allow_standin=allow_standin,
                     seed=seed, subset=mirror == TEST_DATA)


@pytest.fixture(scope="module")
def mirror_load():
    """Load a task of the test data (or of ``mirror=``) once per module (the release's SST-2 train has 67k rows)."""
    return _mirror_load


def assert_normalised(frame, task):
    """Columns, dtypes, label range and non-empty texts of a normalised split."""
    spec = TASKS[task]
    if spec.kind == "qa":
        assert list(frame.columns) == QA_COLUMNS
        for column in ("id", "title", "context", "question"):
            assert pd.api.types.is_string_dtype(frame[column])
        assert all(isinstance(texts, list) and texts for texts in frame["answer_texts"])
        assert all(isinstance(start, int) for starts in frame["answer_starts"] for start in starts)
        return
    assert list(frame.columns) == CLASSIFICATION_COLUMNS
    assert frame["idx"].dtype == np.int64
    assert pd.api.types.is_string_dtype(frame["text_a"])
    assert (frame["text_a"].str.strip() != "").all()
    if spec.paired:
        assert pd.api.types.is_string_dtype(frame["text_b"])
        assert (frame["text_b"].str.strip() != "").all()
    else:
        assert frame["text_b"].isna().all()
    if spec.kind == "regression":
        assert frame["label"].dtype == np.float32
        assert frame["label"].between(0, 5).all()
    else:
        assert frame["label"].dtype == np.int64
        assert set(frame["label"]) == set(range(spec.num_labels))


# ------------------------------------------------------------------ real release files: the test data, the full releases


@pytest.mark.parametrize("mirror, rows", BOTH)
@pytest.mark.parametrize("task", list(FULL_ROWS))
def test_mirror_tasks_match_readme_table(mirror_load, task, mirror, rows):
    splits, provenance = mirror_load(task, mirror=mirror)
    assert {split: len(frame) for split, frame in splits.items()} == dict(
        zip(("train", "validation"), rows[task]))
    for frame in splits.values():
        assert_normalised(frame, task)
        assert (frame["idx"].to_numpy() == np.arange(len(frame))).all()
    assert provenance["source"] == "mirror" and provenance["standin"] is False
    assert provenance["mirror"] == str(mirror.resolve())
    assert len(provenance["files"]) == 2
    sums = dict(line.split()[::-1] for line in (mirror / "SHA256SUMS").read_text().splitlines())
    assert all(sums[name] == digest for name, digest in provenance["files"].items())


@pytest.mark.parametrize("mirror, rows", BOTH)
def test_mirror_values_are_parsed_verbatim(mirror_load, mirror, rows):
    """The first and last rows (both in the test data too) read as written in the release files."""
    rte = mirror_load("rte", mirror=mirror)[0]["train"]
    assert rte.loc[0, "text_a"] == "No Weapons of Mass Destruction Found in Iraq Yet."
    assert rte.loc[0, "label"] == 1  # not_entailment = 1
    mrpc = mirror_load("mrpc", mirror=mirror)[0]["validation"]  # quote characters stay in the text
    assert mrpc.loc[0, "text_b"] == ('" The foodservice pie business does not fit our '
                                     'long-term growth strategy .')
    assert mrpc.loc[0, "label"] == 1
    assert mirror_load("stsb", mirror=mirror)[0]["train"]["label"].iloc[0] == pytest.approx(5.0)
    cola = mirror_load("cola", mirror=mirror)[0]["validation"]  # the file has no final newline
    assert cola["text_a"].iloc[0] == "The sailors rode the breeze clear of the rocks."
    assert cola["text_a"].iloc[-1] == LAST_COLA_DEV
    sst5 = mirror_load("sst5", mirror=mirror)[0]
    assert sst5["train"].loc[0, "label"] == 3
    assert sst5["train"].loc[0, "text_a"].startswith("The Rock is destined to be the 21st")
    assert sst5["validation"].loc[0, "text_a"].startswith("It 's a lovely film with lovely")
    assert sst5["train"]["label"].min() == 0 and sst5["train"]["label"].max() == 4


@pytest.mark.full_release
def test_full_release_sizes_label_counts_and_neighbouring_rows(mirror_load):
    rte = mirror_load("rte", mirror=FULL_MIRROR)[0]["train"]
    assert rte.loc[1, "label"] == 0 and np.bincount(rte["label"]).tolist() == [1249, 1241]
    assert np.bincount(mirror_load("sst2", mirror=FULL_MIRROR)[0]["train"]["label"]).tolist() == [29780, 37569]
    assert mirror_load("stsb", mirror=FULL_MIRROR)[0]["train"]["label"].iloc[:2].tolist() == pytest.approx([5.0, 3.8])
    assert np.bincount(mirror_load("cola", mirror=FULL_MIRROR)[0]["validation"]["label"]).tolist() == [322, 721]
    for task, rows in (("qnli", 5463), ("squad", 10570)):  # dev only: all of it in the stand-in's two parts
        assert sum(map(len, mirror_load(task, allow_standin=True, mirror=FULL_MIRROR)[0].values())) == rows


@pytest.mark.parametrize("task, missing", [("qnli", "glue/QNLI/train.tsv"),
                                           ("squad", "squad/train-v1.1.json")])
def test_missing_train_split_names_file_and_options(task, missing):
    with pytest.raises(MissingSplitError) as info:
        load_task(task, source="mirror", mirror=TEST_DATA, subset=True)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(TEST_DATA.resolve() / missing) in message
    assert "--allow-standin" in message and "allow_standin=True" in message
    assert "--source hub" in message and "stand-in validation part" in message


def test_qqp_missing_both_splits_is_an_error_even_with_standin():
    with pytest.raises(MissingSplitError, match="none is possible") as info:
        load_task("qqp", source="mirror", mirror=TEST_DATA, subset=True, allow_standin=True)
    for name in ("glue/QQP/train.tsv", "glue/QQP/dev.tsv"):
        assert str(TEST_DATA.resolve() / name) in str(info.value)


def test_qnli_standin_is_deterministic_and_disjoint(mirror_load):
    splits, provenance = mirror_load("qnli", allow_standin=True)
    train, validation = splits["train"], splits["validation"]
    dev = SLICE_ROWS["qnli"][1]
    assert len(train) + len(validation) == dev and len(validation) == round(0.2 * dev)
    assert not set(train["idx"]) & set(validation["idx"])
    assert (np.diff(train["idx"]) > 0).all() and (np.diff(validation["idx"]) > 0).all()
    for frame in splits.values():
        assert_normalised(frame, "qnli")
    assert provenance["standin"] is True
    assert "glue/QNLI/train.tsv" in provenance["standin_note"]
    assert "glue/QNLI/dev.tsv" in provenance["standin_note"]
    again, _ = load_task("qnli", source="mirror", mirror=TEST_DATA, subset=True, allow_standin=True)
    pd.testing.assert_frame_equal(again["validation"], validation)
    other = mirror_load("qnli", allow_standin=True, seed=1)[0]["validation"]
    assert set(other["idx"]) != set(validation["idx"])


def test_squad_standin_splits_by_title(mirror_load):
    splits, provenance = mirror_load("squad", allow_standin=True)
    train, validation = splits["train"], splits["validation"]
    questions = SLICE_ROWS["squad"][1]
    assert len(train) + len(validation) == questions
    assert 0.15 < len(validation) / questions < 0.35
    assert not set(train["title"]) & set(validation["title"])
    assert not set(train["context"]) & set(validation["context"])
    assert not set(train["id"]) & set(validation["id"])
    assert train["title"].nunique() + validation["title"].nunique() == 48
    for frame in splits.values():
        assert_normalised(frame, "squad")
    note = provenance["standin_note"]
    assert "by title" in note and "no context is in both" in note


def test_prepare_task_flags_standin_in_meta(tmp_path):
    meta = prepare_task("qnli", tmp_path / "qnli", source="mirror", mirror=TEST_DATA, subset=True,
                        allow_standin=True, max_train_samples=100)
    on_disk = read_meta(tmp_path / "qnli")
    assert on_disk == meta
    assert on_disk["standin"] is True and "not comparable" in on_disk["standin_note"]
    assert on_disk["standin_fraction"] == 0.2
    assert on_disk["rows"] == {"train": 100, "validation": 60}
    assert on_disk["rows_before_subsampling"] == {"train": 240, "validation": 60}
    assert list(on_disk["files"]) == ["glue/QNLI/dev.tsv"]


# ------------------------------------------------------------------ files the mirror lacks


def test_tiny_qqp_parses_and_drops_the_empty_question(tiny_mirror):
    splits, provenance = load_task("qqp", source="mirror", mirror=tiny_mirror, subset=True)
    assert len(splits["train"]) == 19 and len(splits["validation"]) == 19
    assert 7 not in set(splits["train"]["idx"])
    assert provenance["dropped_rows"]["train"] == [f"{tiny_mirror / 'glue/QQP/train.tsv'}, line 9"]
    assert provenance["dropped_rows"]["validation"] == []
    train = splits["train"]
    assert train.loc[0, "text_a"] == 'Is "question" 0 good?'
    assert train["label"].tolist() == [i % 2 for i in range(20) if i != 7]
    for frame in splits.values():
        assert_normalised(frame, "qqp")


def test_tiny_qnli_train_parses(tiny_mirror):
    splits, provenance = load_task("qnli", source="mirror", mirror=tiny_mirror, subset=True)
    assert len(splits["train"]) == 12 and len(splits["validation"]) == 5
    assert splits["train"]["label"].tolist() == [i % 2 for i in range(12)]
    assert splits["train"].loc[3, "text_b"] == 'Book 3 was written by "someone".'
    assert provenance["standin"] is False and len(provenance["files"]) == 2


def test_tiny_squad_train_parses_and_round_trips(tiny_mirror, tmp_path):
    splits, _ = load_task("squad", source="mirror", mirror=tiny_mirror, subset=True)
    assert len(splits["train"]) == 12 and len(splits["validation"]) == 4
    row = splits["train"].iloc[4]
    assert row["id"] == "tr-1-1" and row["title"] == "tr_title_1"
    start = row["answer_starts"][0]
    assert row["context"][start:start + len("answer 1")] == "answer 1"
    meta = prepare_task("squad", tmp_path / "out", source="mirror", mirror=tiny_mirror, subset=True,
                        max_train_samples=5)
    assert meta["labels"]["train"]["articles"] <= 4
    back = read_split(tmp_path / "out", "train")
    assert len(back) == 5 and isinstance(back.loc[0, "answer_texts"], list)
    expected = splits["train"][splits["train"]["id"].isin(back["id"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(back, expected)


def test_tiny_standin_when_only_validation_exists(tiny_mirror):
    (tiny_mirror / "squad/train-v1.1.json").unlink()
    (tiny_mirror / "squad/dev-v1.1.json").write_text(json.dumps(squad_document(5, 2, "dv")))
    splits, provenance = load_task("squad", source="mirror", mirror=tiny_mirror, subset=True,
                                   allow_standin=True, standin_fraction=0.4)
    assert len(splits["validation"]) == 4 and splits["validation"]["title"].nunique() == 2
    assert not set(splits["train"]["title"]) & set(splits["validation"]["title"])
    assert provenance["standin"] and "squad/train-v1.1.json" in provenance["standin_note"]


@pytest.mark.parametrize("edit, match", [
    (lambda text: text.replace("\t0\n", "\t0\textra\n", 1), r"line 2: expected 6 .*found 7"),
    (lambda text: text.replace("\t1\n", "\t2\n", 1), r"line 3: label 2 is not a class in 0\.\.1"),
    (lambda text: text.replace("\t1\n", "\tyes\n", 1), r"line 3: label 'yes' is not an integer"),
    (lambda text: text.replace("is_duplicate", "duplicate", 1), r"line 1: expected the header"),
])
def test_malformed_tsv_names_file_and_line(tiny_mirror, edit, match):
    path = break_file(tiny_mirror, "glue/QQP/dev.tsv", edit)
    with pytest.raises(ValueError, match=match) as info:
        load_task("qqp", source="mirror", mirror=tiny_mirror, subset=True)
    assert str(path) in str(info.value)


def test_unknown_label_string_and_empty_text_are_errors(tiny_mirror):
    path = break_file(tiny_mirror, "glue/QNLI/dev.tsv",
                      lambda text: text.replace("not_entailment", "neutral", 1))
    with pytest.raises(ValueError, match=r"line 3: label 'neutral' is not one of \['entailment'"):
        load_task("qnli", source="mirror", mirror=tiny_mirror, subset=True)
    path.write_text(path.read_text().replace("neutral", "not_entailment").replace(
        "Who wrote 2?", " ", 1))
    with pytest.raises(ValueError, match=rf"{path}, line 4: empty text"):
        load_task("qnli", source="mirror", mirror=tiny_mirror, subset=True)


def test_malformed_sst5_tree_and_squad_answer(tiny_mirror):
    (tiny_mirror / "sst5").mkdir()
    trees = tiny_mirror / "sst5/dev.txt"
    trees.write_text("(3 (2 Fine) (3 film))\n(1 (2 Not) (1 good)\n")
    (tiny_mirror / "sst5/train.txt").write_text("(3 (2 Fine) (3 film))\n(9 (2 Odd))\n")
    with pytest.raises(ValueError, match=r"train\.txt, line 2: label 9 is not a class in 0\.\.4"):
        load_task("sst5", source="mirror", mirror=tiny_mirror, subset=True)
    (tiny_mirror / "sst5/train.txt").write_text("(3 (2 Fine) (3 film))\n")
    with pytest.raises(ValueError, match=rf"{trees}, line 2: malformed tree: unbalanced"):
        load_task("sst5", source="mirror", mirror=tiny_mirror, subset=True)
    document = squad_document(2, 2, "dv")
    document["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 0
    (tiny_mirror / "squad/dev-v1.1.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"question id dv-1-0: answer 'answer 1' is not at"):
        load_task("squad", source="mirror", mirror=tiny_mirror, subset=True)


# ------------------------------------------------------------------ subsampling, prepared folders


def test_subsampling_is_seeded_capped_and_keeps_order(tmp_path):
    kwargs = dict(source="mirror", mirror=TEST_DATA, subset=True, max_train_samples=50, max_eval_samples=30)
    first = prepare_task("rte", tmp_path / "a", seed=3, **kwargs)
    prepare_task("rte", tmp_path / "b", seed=3, **kwargs)
    prepare_task("rte", tmp_path / "c", seed=4, **kwargs)
    a, b, c = (read_split(tmp_path / name, "train") for name in "abc")
    pd.testing.assert_frame_equal(a, b)
    assert set(a["idx"]) != set(c["idx"])
    assert len(a) == 50 and (np.diff(a["idx"]) > 0).all()
    assert len(read_split(tmp_path / "a", "validation")) == 30
    assert first["rows"] == {"train": 50, "validation": 30}
    assert first["rows_before_subsampling"] == {"train": 500, "validation": 100}
    assert first["max_train_samples"] == 50 and first["seed"] == 3
    full = prepare_task("rte", tmp_path / "d", source="mirror", mirror=TEST_DATA, subset=True,
                        max_eval_samples=10_000)
    assert full["rows"] == {"train": 500, "validation": 100}
    with pytest.raises(ValueError, match="max_train_samples must be at least 1"):
        prepare_task("rte", tmp_path / "e", source="mirror", mirror=TEST_DATA, subset=True, max_train_samples=0)


def test_prepare_task_writes_three_files_read_back_equal(mirror_load, tmp_path):
    out = tmp_path / "stsb"
    meta = prepare_task("stsb", out, source="mirror", mirror=TEST_DATA, subset=True)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.parquet",
                                                     "validation.parquet"]
    for split, frame in mirror_load("stsb")[0].items():
        pd.testing.assert_frame_equal(read_split(out, split), frame)
    cola = prepare_task("cola", tmp_path / "cola", source="mirror", mirror=TEST_DATA, subset=True)
    assert cola["labels"]["validation"]["counts"] == {"0": 29, "1": 71}
    for split, frame in mirror_load("cola")[0].items():  # text_b: all null, still str
        pd.testing.assert_frame_equal(read_split(tmp_path / "cola", split), frame)
    expected_keys = {
        "task", "source", "source_requested", "mirror", "hub_id", "hub_config", "hub_revision",
        "hub_commit", "files",
        "standin", "standin_note", "standin_fraction", "subset", "dropped_rows",
        "rows_before_subsampling", "rows", "split_sha256", "max_train_samples", "max_eval_samples", "seed",
        "labels", "created", "istar_version",
    }
    assert set(meta) == expected_keys
    assert meta["labels"]["validation"]["min"] == 0.0 and meta["labels"]["validation"]["max"] == 5.0
    assert meta["source"] == "mirror" and meta["standin"] is False
    assert json.loads((out / "meta.json").read_text()) == meta


def test_read_split_and_meta_say_how_to_prepare(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"run `istar prepare-data --task rte --out"):
        read_split(tmp_path / "rte", "train")
    with pytest.raises(FileNotFoundError, match=r"istar prepare-data --task TASK"):
        read_meta(tmp_path)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        read_split(tmp_path, "test")


def test_failed_write_leaves_no_partial_file(tiny_mirror, tmp_path, monkeypatch):
    out = tmp_path / "qqp"
    prepare_task("qqp", out, source="mirror", mirror=tiny_mirror, subset=True)
    before = (out / "train.parquet").read_bytes()

    def crash(table, handle):
        handle.write(b"PAR1 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_task("qqp", out, source="mirror", mirror=tiny_mirror, subset=True, max_train_samples=3)
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet", "validation.parquet"]
    assert (out / "train.parquet").read_bytes() == before  # untouched, and meta.json is gone
    assert pq.read_table(out / "train.parquet").num_rows == 19


# ------------------------------------------------------------------ sources and arguments


def test_bad_arguments_raise_clear_errors(tiny_mirror, tmp_path, monkeypatch):
    monkeypatch.delenv("ISTAR_DATA_MIRROR", raising=False)
    with pytest.raises(ValueError, match=r"data source 'mirror' needs a mirror folder .*--mirror DIR"):
        load_task("qqp", source="mirror")  # no default folder outside the repository
    with pytest.raises(ValueError, match="unknown task 'mnli'; known tasks: sst2"):
        load_task("mnli", mirror=tiny_mirror, subset=True)
    with pytest.raises(ValueError, match="source must be one of auto, mirror, hub"):
        load_task("qqp", source="disk", mirror=tiny_mirror, subset=True)
    with pytest.raises(FileNotFoundError, match=rf"mirror folder {tmp_path / 'nowhere'} does not"):
        load_task("qqp", source="mirror", mirror=tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"standin_fraction must lie in \(0, 1\)"):
        load_task("qqp", mirror=tiny_mirror, subset=True, standin_fraction=1.0)


def parse(argv):
    from istar.cli import build_parser

    return build_parser("prepare-data").parse_args(["prepare-data", *argv])


def test_cli_says_when_a_standin_is_used_and_reports_errors(tiny_mirror, tmp_path, capsys):
    (tiny_mirror / "glue/QNLI/train.tsv").unlink()
    base = ["--task", "qnli", "--source", "mirror", "--mirror", str(tiny_mirror), "--subset"]
    assert run_cli(parse(base + ["--out", str(tmp_path / "a")])) == 1
    captured = capsys.readouterr()
    assert "error: QNLI: the train split is not in the mirror" in captured.err
    assert "--allow-standin" in captured.err
    assert run_cli(parse(base + ["--out", str(tmp_path / "b"), "--allow-standin"])) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"qnli train STAND-IN: 4 rows (of 4) -> {tmp_path / 'b/train.parquet'}"
    assert printed[1].startswith("qnli validation STAND-IN: 1 rows (of 1)")
    assert any(line.startswith("STAND-IN: ") and "glue/QNLI/train.tsv is missing" in line
               for line in printed)
    assert read_meta(tmp_path / "b")["standin"] is True
