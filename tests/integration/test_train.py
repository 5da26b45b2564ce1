"""Tests of the training engine: every method × head, direction of λ, resume, two CPU ranks, errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mirrors import REPO
from services import ACCELERATE_2_CPU
from train_helpers import read_log, sigma

from istar.config.specs import ModelData, ShrinkageSpec, TrainSpec
from istar.registry.precisions import cpu_has_native_bf16
from istar.steps.activations import activation_statistics
from istar.steps.common import open_model_context
from istar.steps.evaluate import evaluation_report
from istar.steps.launch import free_port
from istar.core.shrinkage import load_shrinkage
from istar.steps.shrinkage import compute_shrinkage_file
from istar.steps.train import train

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def istar_cli(*args, launcher=(sys.executable, "-m", "istar"), env=ENV, **kwargs):
    return subprocess.run([*launcher, *map(str, args)], env=env, cwd=REPO, capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("lam, direction", [(-5.0, -1), (5.0, +1)])
def test_lambda_sign_moves_isoscore_the_right_way(lam, direction, tiny_model_dir, prepared, tmp_path):
    cfg = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte", 160, 16)), output_dir=str(tmp_path),
                    method="istar", lam=lam, zeta=0.0, epochs=4, batch_size=16, learning_rate=1e-3,
                    max_length=64, seed=1)
    train(cfg)
    scores = [float(row["isoscore_star"]) for row in read_log(tmp_path / "train_log.csv")]
    assert len(scores) == 40
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert direction * (last - first) > 0.05, (first, last)


def test_cpu_precision_is_the_one_that_runs_and_is_logged(tiny_model_dir, prepared, tmp_path):
    # fp16 and bf16 both run as bf16 on a processor with native bf16, else fp32 (istar.registry.precisions).
    reduced = "bf16" if cpu_has_native_bf16() else "fp32"
    for precision, effective in [("no", "fp32"), ("fp16", reduced), ("bf16", reduced)]:
        out = tmp_path / precision
        result = istar_cli("train", "--model", tiny_model_dir, "--data", prepared("rte"), "--out", out, "--epochs", 1,
                           "--batch-size", 16, "--mixed-precision", precision, "--method", "cosreg")
        assert result.returncode == 0, result.stderr
        config = json.loads((out / "run_config.json").read_text())
        assert config["precision"] == {"requested": precision, "effective": effective}
        assert f"precision {effective}" in result.stdout


def train_command(model, data, out, sigma_s):
    return ["train", "--model", model, "--data", data, "--out", out, "--method", "istar", "--lam", "-1",
            "--zeta", "0.2", "--sigma-s", sigma_s, "--epochs", 2, "--batch-size", 8, "--checkpoint-every", 5,
            "--shrinkage-rows", 2000, "--max-length", 64, "--learning-rate", 1e-4]


def test_resume_after_kill_equals_uninterrupted_run(tiny_model_dir, prepared, sigma, tmp_path):
    data, sigma_s = prepared("rte", 480, 24), sigma("rte")
    reference = istar_cli(*train_command(tiny_model_dir, data, tmp_path / "reference", sigma_s))
    assert reference.returncode == 0, reference.stderr

    out = tmp_path / "interrupted"
    process = subprocess.Popen([sys.executable, "-m", "istar", *map(str, train_command(tiny_model_dir, data, out, sigma_s))],
                               env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((out / "resume").glob("state-*/COMPLETE")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "metrics.json").exists(), "the run finished before it could be killed"
    killed_at = int(next((out / "resume").glob("state-*/COMPLETE")).parent.name.split("-")[1])

    resumed = istar_cli(*train_command(tiny_model_dir, data, out, sigma_s))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and killed_at < 120
    expected = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    got = json.loads((out / "metrics.json").read_text())
    assert got["epochs"] == expected["epochs"]
    assert read_log(out / "train_log.csv") == read_log(tmp_path / "reference" / "train_log.csv")
    a, _ = load_shrinkage(out / "sigma_epoch1.pt")
    b, _ = load_shrinkage(tmp_path / "reference" / "sigma_epoch1.pt")
    torch.testing.assert_close(a, b, rtol=0, atol=0)




def test_two_cpu_ranks_agree_on_sigma_and_train_with_the_global_penalty(tiny_model_dir, prepared, tmp_path):
    launcher = (str(Path(sys.executable).parent / ACCELERATE_2_CPU[0]), *ACCELERATE_2_CPU[1:])
    # One thread per process, for the ranks and for the single-process reference alike: float32
    # matmuls split over more threads sum in another order (≈ 1e-7 apart), which has nothing to do
    # with how the ranks' rows are merged.
    env = {**ENV, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    data = prepared("rte", 64, 24)
    # Σ_S over all the data: two ranks (each a half, merged) must equal one process.
    args = ("shrinkage", "--model", tiny_model_dir, "--data", data, "--rows", 10**9, "--max-length", 64)
    two = istar_cli(*args, "--out", tmp_path / "two.pt", launcher=launcher, env=env)
    assert two.returncode == 0, two.stderr
    assert "from 2 process(es)" in two.stdout
    one = istar_cli(*args, "--out", tmp_path / "one.pt", env=env)
    assert one.returncode == 0, one.stderr
    sigma_two, prov_two = load_shrinkage(tmp_path / "two.pt")
    sigma_one, prov_one = load_shrinkage(tmp_path / "one.pt")
    assert prov_two["rows"] == prov_one["rows"] and prov_two["num_processes"] == 2
    torch.testing.assert_close(sigma_two, sigma_one, rtol=1e-9, atol=1e-12)

    out = tmp_path / "run"
    run = istar_cli("train", "--model", tiny_model_dir, "--data", data, "--out", out, "--method", "istar",
                    "--lam", -1, "--zeta", 0.2, "--sigma-s", tmp_path / "one.pt", "--global-penalty", "--epochs", 2,
                    "--batch-size", 8, "--max-length", 64, "--shrinkage-rows", 10**9, launcher=launcher, env=env)
    assert run.returncode == 0, run.stderr
    assert "FutureWarning" not in run.stderr, run.stderr[-3000:]  # no deprecated collective in the penalty
    config = json.loads((out / "run_config.json").read_text())
    assert config["num_processes"] == 2 and config["global_penalty"] is True
    assert "Σ_S recomputed for epoch 2" in run.stdout  # merged and checked equal on both ranks
    assert len(read_log(out / "train_log.csv")) == 2 * 4  # 64 examples / (8 per rank × 2 ranks) per epoch


def test_nan_loss_stops_with_the_step(tiny_model_dir, prepared, tmp_path):
    from transformers import BertForSequenceClassification

    broken = tmp_path / "broken"
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    result = istar_cli("train", "--model", broken, "--data", prepared("rte"), "--out", tmp_path / "run", "--epochs", 1)
    assert result.returncode != 0
    assert "non-finite loss at epoch 1, batch 1, optimizer step 1" in result.stderr


def test_clear_errors(tiny_model_dir, prepared, tmp_path):
    result = istar_cli("train", "--model", tmp_path / "no-such-model", "--data", prepared("rte"), "--out", tmp_path / "run")
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = istar_cli("train", "--model", tiny_model_dir, "--data", prepared("rte"), "--out", tmp_path / "run",
                       "--method", "istar", "--lam", "-1")
    assert result.returncode == 2 and "needs --sigma-s" in result.stderr
    result = istar_cli("train", "--model", "package:no_such_package/model", "--data", prepared("rte"), "--out", tmp_path / "r")
    assert result.returncode == 2 and "is not installed" in result.stderr
    result = istar_cli("train", "--model", tiny_model_dir, "--data", tmp_path / "nothing", "--out", tmp_path / "r")
    assert result.returncode == 2 and "prepare-data" in result.stderr


def test_evaluation_report_and_activation_statistics(tiny_model_dir, prepared):
    context = open_model_context(ModelData(model=str(tiny_model_dir), data_dir=str(prepared("rte"))))
    report = evaluation_report(context, "validation", batch_size=64)
    assert report["examples"] == 24 and 0 <= report["metrics"]["accuracy"] <= 1

    tensors, meta = activation_statistics(context, "validation", batch_size=64)
    assert meta["num_hidden_states"] == 3 and meta["task"] == "rte"
    tokens = meta["tokens"]
    for layer in range(3):
        assert tensors[f"cls.layer{layer}"].shape == (24, 32)
        assert tensors[f"token_cov.layer{layer}"].shape == (32, 32)
    assert tensors["last_layer_token_std"].shape == (32,)
    torch.testing.assert_close(tensors["last_layer_token_mean"], tensors["token_mean.layer2"])
    unit_sum = tensors["token_unit_sum.layer2"]
    assert -1 / (tokens - 1) <= float((unit_sum @ unit_sum - tokens) / (tokens * (tokens - 1))) <= 1


def test_global_penalty_over_two_ranks_equals_the_union(tmp_path):
    out = tmp_path / "global.json"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()),
                             str(REPO / "tests" / "support" / "distributed_global_penalty.py"), str(out)],
                            env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # torch.distributed.nn's functional collectives warn (FutureWarning) on first use; the penalty avoids them.
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["global"] == pytest.approx(found["reference"], abs=1e-12)
    assert found["max_grad_error"] < 1e-6 * found["max_grad"]


def kill_after_first_state(command, out):
    """Start ``istar COMMAND…`` and SIGKILL it as soon as it has saved a resumable state."""
    process = subprocess.Popen([sys.executable, "-m", "istar", *map(str, command)], env=ENV, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((out / "resume").glob("state-*/COMPLETE")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "metrics.json").exists(), "the run finished before it could be killed"


def test_resume_after_a_setting_change_starts_afresh(tiny_model_dir, prepared, sigma, tmp_path):
    data, sigma_s = prepared("rte", 480, 24), sigma("rte")
    changed = [*train_command(tiny_model_dir, data, tmp_path / "reference", sigma_s)][:-1] + [2e-4]
    reference = istar_cli(*changed)
    assert reference.returncode == 0, reference.stderr

    out = tmp_path / "run"
    kill_after_first_state(train_command(tiny_model_dir, data, out, sigma_s), out)  # learning rate 1e-4
    assert list(out.glob("sigma_epoch*.pt"))
    rerun = istar_cli(*[out if part == tmp_path / "reference" else part for part in changed])
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming from" not in rerun.stdout
    assert "the run changed since it was saved (setting.learning_rate); starting afresh" in rerun.stdout
    expected = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    got = json.loads((out / "metrics.json").read_text())
    assert got["epochs"] == expected["epochs"] and got["fingerprint"] == expected["fingerprint"]
    assert read_log(out / "train_log.csv") == read_log(tmp_path / "reference" / "train_log.csv")
    assert json.loads((out / "run_config.json").read_text())["fingerprint"] == got["fingerprint"]


def test_restart_discards_the_saved_state(tiny_model_dir, prepared, sigma, tmp_path):
    data, sigma_s = prepared("rte", 480, 24), sigma("rte")
    out = tmp_path / "run"
    kill_after_first_state(train_command(tiny_model_dir, data, out, sigma_s), out)
    rerun = istar_cli(*train_command(tiny_model_dir, data, out, sigma_s), "--restart")
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming from" not in rerun.stdout and (out / "metrics.json").is_file()


def test_non_finite_loss_explains_how_to_restart_and_leaves_no_empty_folder(tiny_model_dir, prepared, tmp_path):
    from transformers import BertForSequenceClassification

    broken = tmp_path / "broken"
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    result = istar_cli("train", "--model", broken, "--data", prepared("rte"), "--out", tmp_path / "run", "--epochs", 1)
    assert result.returncode != 0
    assert "starts afresh by itself, and `--restart`" in result.stderr
    assert not (tmp_path / "run" / "resume").exists()


def test_non_finite_settings_are_rejected(tiny_model_dir, prepared, tmp_path):
    for option, value in (("--lam", "nan"), ("--learning-rate", "inf"), ("--zeta", "nan")):
        result = istar_cli("train", "--model", tiny_model_dir, "--data", prepared("rte"), "--out", tmp_path / "run",
                           "--method", "cosreg", option, value)
        assert result.returncode == 2 and "must be a finite number" in result.stderr, (option, result.stderr[-500:])


def test_compiled_step_equals_the_eager_step_on_cpu(tiny_model_dir, prepared):
    """training.compile = default on the CPU (inductor; needs g++): the I-STAR step, penalty inside the compiled
    function, gives the eager step's losses, penalty and weights over three optimizer steps (dropout from the
    same random stream: inductor's fallback_random, so that only the kernels differ)."""
    import shutil

    import torch._inductor.config as inductor_config
    from accelerate import Accelerator

    from istar.data import read_split
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task
    from istar.steps.train_step import build_optimizer, optimization_step, step_forward

    if not shutil.which("g++"):
        pytest.skip("no C++ compiler: torch.compile cannot build CPU kernels here (the setting is refused)")
    frame = read_split(prepared("rte"), "train")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    batch = dict(tokenizer(list(frame["text_a"][:8]), list(frame["text_b"][:8]), truncation=True, max_length=32,
                           padding="max_length", return_tensors="pt"))
    batch["labels"] = torch.tensor(frame["label"][:8].tolist())
    spec = TrainSpec(model="", data_dir="", output_dir="", method="istar", lam=-1.0, zeta=0.2, compile="default")
    sigma_s = torch.cov(torch.randn(128, 32, generator=torch.Generator().manual_seed(1)).T).double()

    def three_steps(forward):
        torch.manual_seed(0)
        model = load_model(str(tiny_model_dir), get_task("rte")).train()
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, build_optimizer(model, spec))
        constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        torch.manual_seed(1)
        losses = []
        for _ in range(3):
            loss, _, penalty = optimization_step(spec, accelerator, model, optimizer, constant, batch, sigma_s, False,
                                                 forward)
            losses.append((float(loss.detach()), float(penalty.logs["isoscore_star"])))
        return losses, [p.detach().clone() for p in model.parameters()]

    monkey = pytest.MonkeyPatch()
    monkey.setattr(inductor_config, "fallback_random", True)
    try:
        compiled = three_steps(step_forward("default", torch.device("cpu")))
    finally:
        monkey.undo()
        torch._dynamo.reset()
    eager = three_steps(step_forward("none", torch.device("cpu")))
    assert sum(compiled[0], ()) == pytest.approx(sum(eager[0], ()), rel=1e-4, abs=1e-6)
    for got, expected in zip(compiled[1], eager[1]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_step_that_keeps_recompiling_warns_once():
    """warn_on_recompiles on a real torch.compile (dynamo, eager backend: no kernels to build) of a function
    compiled afresh for every input shape: quiet while the recompilations stay within the limit, one warning after.
    In this lane for dynamo's start-up (tens of seconds on a busy CPU)."""
    import warnings

    from istar.steps.train_step import warn_on_recompiles

    torch._dynamo.reset()
    step = warn_on_recompiles(torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False), "default", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 2, 3, 1, 2):
            step(torch.ones(rows))
        assert not caught
        for rows in (4, 5, 6):
            step(torch.ones(rows))
    torch._dynamo.reset()
    assert [str(w.message)[:70] for w in caught] == [
        "training.compile = default: the step has been compiled 3 more times si"]


def test_two_ranks_and_one_process_accumulating_their_batches_take_the_same_steps(tiny_model_dir, prepared, tmp_path):
    """training.replicas_as_micro_batches: the authors' DDP form (two gloo ranks, each its own batch of 8 and its
    own I-STAR penalty, two micro-batches per step, gradients averaged) against one process accumulating
    micro_batches_per_step = 4 micro-batches, on the same data order: every logged loss and penalty, the
    learning rate, and the weights after four optimizer steps agree to float tolerance (dropout off: its
    random streams are the one thing the forms do not share)."""
    from safetensors.torch import load_file
    from transformers import BertForSequenceClassification

    from istar.config.gpu_slots import micro_batches_per_step

    model = tmp_path / "no-dropout"
    BertForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2, hidden_dropout_prob=0.0,
                                                  attention_probs_dropout_prob=0.0).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((tiny_model_dir / name).read_bytes())
    data, sigma_s = prepared("rte", 64, 24), tmp_path / "sigma0.pt"  # Σ_S of the model the runs start from
    compute_shrinkage_file(ShrinkageSpec(model=str(model), data_dir=str(data), out=str(sigma_s), rows=2000))
    launcher = (str(Path(sys.executable).parent / ACCELERATE_2_CPU[0]), *ACCELERATE_2_CPU[1:])
    env = {**ENV, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}  # (one thread: the same summation order)
    common = ("train", "--model", model, "--data", data, "--method", "istar", "--lam", -1,
              "--zeta", 0.2, "--sigma-s", sigma_s, "--epochs", 2, "--batch-size", 8, "--max-length", 64,
              "--shrinkage-rows", 2000, "--learning-rate", 1e-3)
    training = {"gpus": 2, "gradient_accumulation_steps": 2, "replicas_as_micro_batches": True}
    two = istar_cli(*common, "--out", tmp_path / "two", "--gradient-accumulation-steps", 2, launcher=launcher, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    one = istar_cli(*common, "--out", tmp_path / "one", "--gradient-accumulation-steps",
                    micro_batches_per_step(training), env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "run_config.json").read_text())["num_processes"] == 2
    logs = [read_log(tmp_path / form / "train_log.csv") for form in ("two", "one")]
    assert [row["step"] for row in logs[0]] == [row["step"] for row in logs[1]] == ["1", "2", "3", "4"]
    for ranks, single in zip(*logs):
        for key in ("loss", "task_loss", "penalty", "isoscore_star", "lr"):
            assert float(ranks[key]) == pytest.approx(float(single[key]), rel=1e-5, abs=1e-7), (key, ranks, single)
    weights = [load_file(tmp_path / form / "model" / "model.safetensors") for form in ("two", "one")]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=1e-5, atol=1e-6)
