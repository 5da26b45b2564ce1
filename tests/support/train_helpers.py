"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/steps/test_train.py, tests/integration/test_train.py."""

import csv

import pytest

from istar.config.specs import ShrinkageSpec
from istar.steps.shrinkage import compute_shrinkage_file


def read_log(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def sigma(tiny_model_dir, prepared, tmp_path_factory):
    """sigma(task) -> a Σ_S file of the tiny model on the task's (subsampled) training data, of 2,000 rows: a run
    reading it asks for that budget (shrinkage_rows=2000)."""
    cache = {}

    def make(task):
        if task not in cache:
            out = tmp_path_factory.mktemp("sigma") / f"{task}.pt"
            compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(prepared(task)), out=str(out),
                                                 rows=2000, doc_stride=32, batch_size=32))
            cache[task] = out
        return cache[task]

    return make
