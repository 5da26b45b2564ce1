"""Tests of the workflow configuration: schema, defaults, clear errors, and the run plan."""

import subprocess
import sys
from pathlib import Path

import yaml
from config_helpers import with_change
from mirrors import REPO


def test_snakemake_stops_before_any_job_on_a_bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change("search.zetas", [0.2, 2.0])))
    result = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "--configfile", str(bad)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0
    assert "invalid configuration: config key 'search.zetas[1]': 2.0 is greater than the maximum of 1" in result.stdout + result.stderr
    assert "Job stats" not in result.stdout


def test_snakemake_names_the_yaml_error_of_the_default_config(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("tasks: [rte\nmodels: {}\n")
    result = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "--snakefile",
                             str(REPO / "workflow" / "Snakefile"), "--directory", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0
    assert "config/config.yaml:2:7: invalid YAML" in result.stdout + result.stderr
