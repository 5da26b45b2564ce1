"""Tests of the analysis step against direct computations on the token vectors of a real run."""

import json
import os
import subprocess
import sys

from analysis_helpers import ZETA, result, run
from mirrors import REPO

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_cli(run, result, tmp_path):
    out = tmp_path / "cli.json"
    command = [sys.executable, "-m", "istar", "analyze", "--activations", str(run["activations"]), "--sigma-s",
               str(run["sigma"]), "--zeta", str(ZETA), "--out", str(out)]
    done = subprocess.run(command, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert "IsoScore*" in done.stdout
    done = subprocess.run(command[:-4] + ["--zeta", "2", "--out", str(out)], env=ENV, cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 2 and "zeta must lie in [0, 1]" in done.stderr


def test_measure_equals_the_separate_steps(run, result, tmp_path):
    """`istar measure` (the workflow's one process per setting) writes what `istar evaluate`,
    `istar activations` and `istar analyze` write one by one."""
    from istar.config.specs import EvaluateSpec
    from istar.steps.evaluate import evaluate_checkpoint

    out = tmp_path / "measures.json"
    command = [sys.executable, "-m", "istar", "measure", "--runs", str(run["run"]), "--data", str(run["data"]),
               "--sigma-s", str(run["sigma"]), "--zeta", str(ZETA), "--evaluate", "--out", str(out)]
    done = subprocess.run(command, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "1 run(s) measured" in done.stdout
    measures = json.loads(out.read_text())
    assert list(measures["runs"]) == [str(run["run"])] and measures["evaluated"] is True
    assert measures["precision"] == "fp32"  # what ran: no precision was asked for
    assert json.loads(run["sigma"].with_suffix(".json").read_text())["precision"] == "fp32"
    entry = measures["runs"][str(run["run"])]
    assert entry["analysis"] == {key: value for key, value in json.loads(json.dumps(result)).items() if key != "sha256"}
    evaluation = evaluate_checkpoint(EvaluateSpec(model=str(run["run"] / "model"), data_dir=str(run["data"]),
                                                  out=str(tmp_path / "eval.json")))
    assert entry["evaluation"] == json.loads(json.dumps(evaluation))
    missing = subprocess.run([*command[:5], str(tmp_path / "untrained"), *command[6:]], env=ENV, cwd=REPO,
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "train these runs first" in missing.stderr
