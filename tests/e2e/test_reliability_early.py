"""Every bad input named before work starts (issue 33): a config key written twice, names that
cannot become paths, data files that are not UTF-8, a measurement of a run on another task, data
or model, and Σ_S files of another task or model given to a step.

(Free disk space before training: tests/integration/test_reliability_faults.py; runs rebuilt by the
workflow: tests/e2e/test_reliability_rebuild.py.)
"""

import subprocess

from mirrors import REPO
from reliability_early_helpers import ENV, SNAKEMAKE


def test_a_nested_key_written_twice_in_the_default_config_is_refused_by_snakemake(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("tasks: [rte]\ntraining:\n  epochs: 1\n  batch_size: 8\n"
                                                     "  epochs: 2\n")
    dry = subprocess.run([SNAKEMAKE, "-n", "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory",
                          str(tmp_path)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert dry.returncode != 0
    assert "config/config.yaml:5:3: config key 'training.epochs' is written twice (lines 3 and 5)" in dry.stdout + dry.stderr
