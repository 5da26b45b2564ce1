"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/data/test_data.py, tests/integration/test_data.py."""

import json

import pytest


# ------------------------------------------------------------------ tiny mirrors written here


def write_tsv(path, rows, header=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(map(str, row)) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def squad_document(n_articles, questions_per_article, tag):
    articles = []
    for a in range(n_articles):
        context = f"Article {a} of {tag} says that the answer {a} is here."
        qas = [{
            "id": f"{tag}-{a}-{q}",
            "question": f"What does article {a} say ({q})?",
            "answers": [{"text": f"answer {a}", "answer_start": context.index(f"answer {a}")}],
        } for q in range(questions_per_article)]
        articles.append({"title": f"{tag}_title_{a}", "paragraphs": [{"context": context,
                                                                       "qas": qas}]})
    return {"version": "1.1", "data": articles}


QQP_HEADER = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")
QNLI_HEADER = ("index", "question", "sentence", "label")


@pytest.fixture
def tiny_mirror(tmp_path):
    """A mirror with the files the test data (and the offline mirror) lack: QQP, QNLI train, SQuAD train."""
    root = tmp_path / "mirror"
    qqp = [(i, 2 * i, 2 * i + 1, f'Is "question" {i} good?', f"Is question {i} fine?", i % 2)
           for i in range(20)]
    qqp[7] = (7, 14, 15, "How can I create an Android app?", "", 0)  # as in the real train split
    write_tsv(root / "glue/QQP/train.tsv", qqp, QQP_HEADER)
    write_tsv(root / "glue/QQP/dev.tsv", qqp[:7] + qqp[8:], QQP_HEADER)
    labels = ("entailment", "not_entailment")
    qnli = [(i, f"Who wrote {i}?", f"Book {i} was written by \"someone\".", labels[i % 2])
            for i in range(12)]
    write_tsv(root / "glue/QNLI/train.tsv", qnli, QNLI_HEADER)
    write_tsv(root / "glue/QNLI/dev.tsv", qnli[:5], QNLI_HEADER)
    (root / "squad").mkdir(parents=True)
    (root / "squad/train-v1.1.json").write_text(json.dumps(squad_document(4, 3, "tr")))
    (root / "squad/dev-v1.1.json").write_text(json.dumps(squad_document(2, 2, "dv")))
    return root


# ------------------------------------------------------------------ malformed files


def break_file(root, relative, edit):
    path = root / relative
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    return path
