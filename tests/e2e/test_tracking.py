"""Trackers through accelerate, against the real libraries: TensorBoard's event files read back
with TensorBoard's own reader, DVCLive's files rendered by `dvc plots show`, MLflow against a
real tracking server started here on 127.0.0.1 and stopped by its PID. A killed and resumed run
continues the same tracker runs with every step once; an unreachable server stops a run in one
line before training; a server that goes away mid-run costs a warning, not the run."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mirrors import REPO
from services import ACCELERATE_2_CPU, MlflowServer, free_port

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
ENV.pop("MLFLOW_TRACKING_URI", None)


DVC = str(Path(sys.executable).parent / "dvc")  # this environment's, whatever PATH holds


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


def train_args(model, data, out, *extra):
    return ["train", "--model", model, "--data", data, "--out", out, "--method", "istar", "--lam", "-1", "--zeta", "0",
            "--batch-size", 8, "--max-length", 64, "--shrinkage-rows", 1000, "--learning-rate", 1e-4, *extra]


def istar(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "istar", *map(str, args)], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=600, **kwargs)


def read_log(path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def tensorboard_scalars(run: Path) -> dict:
    """tag → [(step, value)] as TensorBoard shows them (its own reader; events of purged steps dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run / "tracking" / "tensorboard" / "istar"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def dvc_plots(project: Path, run: Path) -> dict:
    """metric → [(step, value)] as `dvc plots show` renders DVCLive's files (in a DVC project around the run)."""
    if not (project / ".dvc").is_dir():
        subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=project, check=True, env=ENV)
    metrics = run / "tracking" / "dvclive" / "plots" / "metrics"
    result = subprocess.run([DVC, "plots", "show", "-x", "step", "--json", str(metrics.relative_to(project))], cwd=project,
                            capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    plots = {}
    for path, renders in data.items():
        name = str(Path(path).relative_to(metrics.relative_to(project)).with_suffix(""))
        values = renders[0]["content"]["data"]["values"]
        field = Path(path).stem
        plots[name] = [(int(v["step"]), float(v[field])) for v in values]
    return plots


def mlflow_history(server, run_id: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics}


def test_each_tracker_receives_the_curves_and_the_settings(tiny_model_dir, prepared, mlflow_server, tmp_path):
    out = tmp_path / "run"
    result = istar(*train_args(tiny_model_dir, prepared("rte"), out, "--epochs", 2, "--trackers", "tensorboard",
                               "dvclive", "mlflow", "--mlflow-tracking-uri", mlflow_server.uri))
    assert result.returncode == 0, result.stderr[-3000:]
    log = read_log(out / "train_log.csv")
    metrics = json.loads((out / "metrics.json").read_text())
    steps = [int(row["step"]) for row in log]
    assert steps == list(range(1, 13))  # 48 examples, batch 8, 2 epochs
    expected = {f"train/{key}": [(int(row["step"]), float(row[key])) for row in log]
                for key in ("loss", "task_loss", "penalty", "isoscore_star", "lr")}
    expected["eval/accuracy"] = [(epoch["step"], epoch["accuracy"]) for epoch in metrics["epochs"]]
    expected["sigma_s_isoscore"] = list(zip([0, 6, 12], metrics["sigma_s_isoscore"]))

    config = json.loads((out / "run_config.json").read_text())
    run_id = config["trackers"]["mlflow"]["run_id"]
    found = {"tensorboard": tensorboard_scalars(out), "dvclive": dvc_plots(tmp_path, out),
             "mlflow": mlflow_history(mlflow_server, run_id)}
    for tracker, curves in found.items():
        for key, points in expected.items():
            assert [s for s, _ in curves[key]] == [s for s, _ in points], (tracker, key)
            assert [v for _, v in curves[key]] == pytest.approx([v for _, v in points], rel=1e-6), (tracker, key)

    # the settings as parameters, with the code's provenance
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=mlflow_server.uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == str(out)
    assert float(run.data.params["learning_rate"]) == 1e-4 and run.data.params["method"] == "istar"
    assert run.data.params["provenance.git"] == json.dumps(config["provenance"]["git"])
    params = (out / "tracking" / "dvclive" / "params.yaml").read_text()
    assert "learning_rate: 0.0001" in params and "method: istar" in params
    hparams = list((out / "tracking" / "tensorboard" / "istar").glob("*/hparams.yml"))
    assert len(hparams) == 1 and "method: istar" in hparams[0].read_text()


def kill_between_states(command: list, out: Path) -> int:
    """Start ``istar COMMAND…``; SIGKILL it once the live log is two rows past a saved state.

    Returns the step of the state the run will resume from.
    """
    process = subprocess.Popen([sys.executable, "-m", "istar", *map(str, command)], env=ENV, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    saved = None
    while time.time() < deadline and process.poll() is None:
        states = list((out / "resume").glob("state-*/COMPLETE"))
        live = out / "resume" / "train_log.csv"
        if states and live.exists():
            saved = int(states[0].parent.name.split("-")[1])
            if len(read_log(live)) >= saved + 2:
                break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert saved is not None and not (out / "metrics.json").exists(), "the run ended before it could be killed"
    # the state may have been replaced by a newer one while the log grew: resume starts from the newest
    return max(int(p.parent.name.split("-")[1]) for p in (out / "resume").glob("state-*/COMPLETE"))


def test_a_killed_and_resumed_run_continues_the_same_tracker_runs(tiny_model_dir, prepared, mlflow_server, tmp_path):
    out = tmp_path / "run"
    command = train_args(tiny_model_dir, prepared("rte", 160, 24), out, "--epochs", 1, "--checkpoint-every", 5,
                         "--trackers", "tensorboard", "dvclive", "mlflow", "--mlflow-tracking-uri", mlflow_server.uri)
    resume_step = kill_between_states(command, out)
    state = max((out / "resume").glob("state-*"))
    run_id = json.loads((state / "tracking.json").read_text())["mlflow"]["run_id"]
    before = mlflow_history(mlflow_server, run_id)["train/loss"]
    logged = max(step for step, _ in before)
    assert logged > resume_step, "the trackers hold no step past the state: the test would not show a rollback"
    # DVCLive rewrites its summary in place each step: a kill in mid-write leaves it empty (seen in CI)
    (out / "tracking" / "dvclive" / "metrics.json").write_text("")

    result = istar(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {state}" in result.stdout
    log = read_log(out / "train_log.csv")
    expected = [(int(row["step"]), float(row["loss"])) for row in log]
    assert [s for s, _ in expected] == list(range(1, 21))
    config = json.loads((out / "run_config.json").read_text())
    assert config["trackers"]["mlflow"]["run_id"] == run_id  # the same MLflow run, continued

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("istar").experiment_id],
                              filter_string=f"attributes.run_name = '{out}'")
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    curves = {"tensorboard": tensorboard_scalars(out)["train/loss"], "dvclive": dvc_plots(tmp_path, out)["train/loss"],
              "mlflow": mlflow_history(mlflow_server, run_id)["train/loss"]}
    for tracker, points in curves.items():  # no gap, no step twice, the values of train_log.csv
        assert [s for s, _ in points] == list(range(1, 21)), tracker
        assert [v for _, v in points] == pytest.approx([v for _, v in expected], rel=1e-6), tracker
    # the points MLflow had before the kill were kept, not sent again (a resumed run recomputes the same values)
    assert before == [p for p in curves["mlflow"] if p[0] <= logged]


def test_an_unreachable_server_stops_the_run_in_one_line_before_training(tiny_model_dir, prepared, tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    started = time.monotonic()
    result = istar(*train_args(tiny_model_dir, prepared("rte"), out, "--trackers", "mlflow", "--mlflow-tracking-uri", uri))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"istar train: error: the MLflow tracking server {uri} cannot be reached")
    assert "mlflow server --host 127.0.0.1" in lines[0] and "tracking.trackers" in lines[0]
    # nothing was loaded or trained (the folder itself may hold the run's writer lock)
    assert not any((out / name).exists() for name in ("resume", "model", "metrics.json", "tracking"))
    assert time.monotonic() - started < 60

    result = istar(*train_args(tiny_model_dir, prepared("rte"), out, "--trackers", "mlflow"))
    assert result.returncode == 2 and "MLFLOW_TRACKING_URI" in result.stderr.strip().splitlines()[-1]


def test_a_server_that_goes_away_mid_run_costs_a_warning_not_the_run(tiny_model_dir, prepared, tmp_path):
    from mlflow.tracking import MlflowClient

    server = MlflowServer(tmp_path / "mlflow").start()
    out = tmp_path / "run"
    command = train_args(tiny_model_dir, prepared("rte", 160, 24), out, "--epochs", 2, "--trackers", "tensorboard",
                         "mlflow", "--mlflow-tracking-uri", server.uri)
    process = subprocess.Popen([sys.executable, "-m", "istar", *map(str, command)], env=ENV, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = MlflowClient(tracking_uri=server.uri)
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            runs = client.search_runs([client.get_experiment_by_name("istar").experiment_id]) \
                if client.get_experiment_by_name("istar") else []
            if runs and len(client.get_metric_history(runs[0].info.run_id, "train/loss")) >= 3:
                break
            time.sleep(0.2)
    finally:
        server.stop()
    assert process.poll() is None, "the run ended before the server could be stopped"
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    assert stderr.count("tracker mlflow failed") == 1, stderr[-3000:]
    assert "train_log.csv has them all" in stderr
    assert "points not delivered to mlflow" in stderr
    assert [int(row["step"]) for row in read_log(out / "train_log.csv")] == list(range(1, 41))
    assert json.loads((out / "metrics.json").read_text())["final"]["step"] == 40
    assert [s for s, _ in tensorboard_scalars(out)["train/loss"]] == list(range(1, 41))  # the other tracker has it all


def test_the_schema_lists_exactly_the_tracker_registry():
    from istar.config.schema import load_schema
    from istar.steps.tracking import TRACKERS

    schema = load_schema()["properties"]["tracking"]["properties"]["trackers"]
    assert schema["items"]["enum"] == list(TRACKERS) and schema["default"] == []


def test_trackers_and_provenance_stay_out_of_the_fingerprint(tiny_model_dir, prepared):
    """A new tracker or a new commit must not invalidate finished runs or resume states."""
    import dataclasses

    from istar.config.specs import TrainSpec
    from istar.steps.resume import run_fingerprint

    spec = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir="a", method="base")
    traced = dataclasses.replace(spec, trackers=["tensorboard", "mlflow"], mlflow_tracking_uri="http://127.0.0.1:1",
                                 tracking_experiment="other")
    meta = json.loads((prepared("rte") / "meta.json").read_text())
    fingerprint = run_fingerprint(spec, meta, str(tiny_model_dir), 1, "fp32")
    assert run_fingerprint(traced, meta, str(tiny_model_dir), 1, "fp32") == fingerprint
    assert not any("provenance" in key or "git" in key for key in fingerprint)


def test_the_config_chooses_the_trackers_of_every_run():
    from istar.config.layout import Setting
    from istar.config.schema import ConfigError
    from istar.pipeline.plan import train_spec
    from istar.pipeline.validate import load_config, validate_config

    config = load_config(REPO / "config" / "config.yaml")
    assert config["tracking"] == {"trackers": [], "experiment": "istar", "mlflow_tracking_uri": None}  # off in the demo
    config["tracking"].update(trackers=["tensorboard", "mlflow"], mlflow_tracking_uri="http://127.0.0.1:5000")
    spec = train_spec(validate_config(config, check_paths=False), model="minilm", task="rte", setting=Setting("base"),
                      seed=0, data_dir="resources/data/rte", output_dir="results/runs/minilm/rte/base/seed0",
                      sigma_s=None)
    assert spec.trackers == ["tensorboard", "mlflow"] and spec.mlflow_tracking_uri == "http://127.0.0.1:5000"
    config["tracking"]["trackers"] = ["wandb"]
    with pytest.raises(ConfigError, match=r"tracking\.trackers\[0\]"):
        validate_config(config, check_paths=False)


def test_only_the_main_process_logs_under_data_parallelism(tiny_model_dir, prepared, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    launcher = [str(Path(sys.executable).parent / ACCELERATE_2_CPU[0]), *ACCELERATE_2_CPU[1:]]
    out = tmp_path / "run"
    args = train_args(tiny_model_dir, prepared("rte", 64, 24), out, "--epochs", 1, "--trackers", "tensorboard",
                      "dvclive", "mlflow", "--mlflow-tracking-uri", mlflow_server.uri)
    result = subprocess.run([*launcher, *map(str, args)], env={**ENV, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "run_config.json").read_text())["num_processes"] == 2
    steps = list(range(1, 5))  # 64 examples / (8 per rank × 2 ranks)
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("istar").experiment_id],
                              filter_string=f"attributes.run_name = '{out}'")
    assert len(runs) == 1  # one MLflow run, not one per process
    assert [s for s, _ in mlflow_history(mlflow_server, runs[0].info.run_id)["train/loss"]] == steps
    assert len(list((out / "tracking" / "tensorboard" / "istar").glob("events.out.tfevents.*"))) == 1
    assert [s for s, _ in tensorboard_scalars(out)["train/loss"]] == steps
    assert [s for s, _ in dvc_plots(tmp_path, out)["train/loss"]] == steps
