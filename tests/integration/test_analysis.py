"""`istar measure` on one run from the command line, against the analysis and evaluation computed in-process."""

import json
import os
import subprocess
import sys

from analysis_helpers import ZETA, measured, result, run
from mirrors import REPO

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_measure_cli_of_one_run(run, result, tmp_path):
    from istar.steps.common import open_model_context
    from istar.steps.evaluate import evaluation_report

    out = tmp_path / "measures.json"
    command = [sys.executable, "-m", "istar", "measure", "--runs", str(run["run"]), "--data", str(run["data"]),
               "--sigma-s", str(run["sigma"]), "--zeta", str(ZETA), "--evaluate", "--out", str(out)]
    done = subprocess.run(command, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "1 run(s) measured" in done.stdout and "IsoScore*" in done.stdout
    measures = json.loads(out.read_text())
    assert list(measures["runs"]) == [str(run["run"])] and measures["evaluated"] is True
    assert measures["precision"] == "fp32"  # what ran: no precision was asked for
    assert json.loads(run["sigma"].with_suffix(".json").read_text())["precision"] == "fp32"
    entry = measures["runs"][str(run["run"])]
    assert entry["analysis"] == json.loads(json.dumps(result))
    context = open_model_context(run["spec"].model_data(str(run["run"])))
    evaluation = evaluation_report(context, run["spec"].split, run["spec"].batch_size)
    assert entry["evaluation"] == json.loads(json.dumps(evaluation))
    wrong_zeta = subprocess.run([*command[:-5], "--zeta", "2", "--evaluate", "--out", str(out)], env=ENV, cwd=REPO,
                                capture_output=True, text=True)
    assert wrong_zeta.returncode == 2 and "zeta must lie in [0, 1]" in wrong_zeta.stderr
    missing = subprocess.run([*command[:5], str(tmp_path / "untrained"), *command[6:]], env=ENV, cwd=REPO,
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "train these runs first" in missing.stderr
