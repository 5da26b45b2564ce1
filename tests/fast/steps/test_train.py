"""Tests of the training engine: every method × head, direction of λ, resume, two CPU ranks, errors."""

import dataclasses
import json
import os

import pytest
import torch
from train_helpers import read_log, sigma

from istar.config.specs import ShrinkageSpec, TrainSpec
from istar.core.isotropy import isoscore_star_from_covariance
from istar.core.shrinkage import load_layer_statistics, load_shrinkage
from istar.steps.shrinkage import compute_shrinkage_file
from istar.steps.train import train


@pytest.mark.parametrize("task", ["rte", "stsb", "squad"])
@pytest.mark.parametrize("method", ["base", "cosreg", "istar"])
def test_every_method_and_head_trains(task, method, tiny_model_dir, prepared, sigma, tmp_path):
    cfg = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared(task)), output_dir=str(tmp_path / "run"),
                    method=method, lam=0.0 if method == "base" else -1.0,
                    zeta=0.2, sigma_s=str(sigma(task)), epochs=2, batch_size=16,
                    shrinkage_rows=2000, doc_stride=32, learning_rate=1e-4)
    report = train(cfg)
    out = tmp_path / "run"
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(report))
    assert [e["epoch"] for e in report["epochs"]] == [1, 2]
    assert report["metric"] in report["final"]
    assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert not (out / "resume").exists()
    log = read_log(out / "train_log.csv")
    assert len(log) == report["final"]["step"]
    assert all(float(row["task_loss"]) == float(row["task_loss"]) for row in log)  # finite, not NaN
    # IsoScore of Σ_S before training and after each epoch, for every method
    assert len(report["sigma_s_isoscore"]) == 3 and all(0 < v < 1 for v in report["sigma_s_isoscore"])
    if method == "istar":
        assert all(0 <= float(row["isoscore_star"]) <= 1 for row in log)
        assert (out / "sigma_epoch0.pt").is_file() and (out / "sigma_epoch1.pt").is_file()
        assert not (out / "sigma_epoch2.pt").exists()  # no epoch trains with it
        sigma1, provenance = load_shrinkage(out / "sigma_epoch1.pt")
        assert provenance["epoch"] == 1 and sigma1.shape == (32, 32)
        for epoch in (0, 1):  # the Σ_S each epoch trained with is the one whose IsoScore is recorded
            assert report["sigma_s_isoscore"][epoch] == pytest.approx(
                float(isoscore_star_from_covariance(load_shrinkage(out / f"sigma_epoch{epoch}.pt")[0], 0.0)), abs=1e-9)
    else:
        assert not list(out.glob("sigma_epoch*.pt"))
    if method == "cosreg":
        assert all(-1 <= float(row["cosine_similarity"]) <= 1 for row in log)
    if task == "squad":
        assert report["standin"] is True and set(report["final"]) >= {"f1", "exact_match"}
    config = json.loads((out / "run_config.json").read_text())
    assert config["precision"] == {"requested": "no", "effective": "fp32"}


def test_one_layer_run_rebuilds_its_sigma_from_the_global_file(tiny_model_dir, prepared, sigma, tmp_path):
    cfg = TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(tmp_path),
                    method="istar", lam=-1.0, zeta=0.2, layers=2, sigma_s=str(sigma("rte")), epochs=1,
                    shrinkage_rows=2000)
    train(cfg)
    used, provenance = load_shrinkage(tmp_path / "sigma_epoch0.pt")
    per_layer, _ = load_layer_statistics(sigma("rte"))
    assert provenance["layers"] == [2] and provenance["rows"] == per_layer[2].count
    torch.testing.assert_close(used, per_layer[2].covariance())
    everything, _ = load_shrinkage(sigma("rte"))
    assert not torch.allclose(used, everything)


def test_shrinkage_equals_the_covariance_of_all_stacked_rows(tiny_model_dir, prepared, tmp_path):
    from istar.data import read_split
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task

    data = prepared("rte")
    compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(data), out=str(tmp_path / "s.pt"),
                                         layers="all+embeddings", rows=10**9, batch_size=32))
    frame = read_split(data, "train")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), get_task("rte")).eval()
    batch = tokenizer(list(frame["text_a"]), list(frame["text_b"]), truncation=True, max_length=128,
                      padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].bool()
    for layers in ([0, 1, 2], [1, 2], [2]):
        rows = torch.cat([states[i][mask] for i in layers]).double()
        sigma, provenance = load_shrinkage(tmp_path / "s.pt", expected_layers=layers)
        assert provenance["rows"] == rows.shape[0]
        torch.testing.assert_close(sigma, torch.cov(rows.T), rtol=1e-4, atol=1e-6)


def test_all_positions_shrinkage_is_numpy_covariance_over_every_padded_position(tiny_model_dir, prepared, tmp_path):
    """Σ_S over all positions: batches in the step's seeded order, each padded to its own longest sequence
    (as the reference's collator pads), every position a row; the real-token Σ_S of the same batches
    keeps only the masked ones."""
    import numpy as np

    from istar.data import read_split
    from istar.data.encoding import EpochShuffleSampler
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task

    data, batch_size, layers = prepared("rte"), 8, [1, 2]
    frame = read_split(data, "train")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), get_task("rte")).eval()
    order = list(EpochShuffleSampler(len(frame), 0))
    expected = {"real": [], "all_positions": []}
    for start in range(0, len(order), batch_size):
        chunk = frame.iloc[order[start:start + batch_size]]
        batch = tokenizer(list(chunk["text_a"]), list(chunk["text_b"]), truncation=True, max_length=128,
                          padding="longest", return_tensors="pt")
        with torch.no_grad():
            states = model(**batch, output_hidden_states=True).hidden_states
        mask = batch["attention_mask"].bool().numpy()
        for i in layers:
            vectors = states[i].double().numpy()
            expected["real"].append(vectors[mask])
            expected["all_positions"].append(vectors.reshape(-1, vectors.shape[-1]))
    padded = sum(len(rows) for rows in expected["all_positions"])
    assert padded > sum(len(rows) for rows in expected["real"])  # the batches hold padding
    for tokens, rows in expected.items():
        out = tmp_path / f"{tokens}.pt"
        compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(data), out=str(out), layers=layers,
                                             tokens=tokens, rows=10**9, batch_size=batch_size))
        rows = np.concatenate(rows)
        sigma, provenance = load_shrinkage(out)
        assert provenance["tokens"] == tokens and provenance["rows"] == rows.shape[0]
        np.testing.assert_allclose(sigma.numpy(), np.cov(rows.T), rtol=1e-4, atol=1e-6)


def test_all_positions_run_logs_its_rows_and_refuses_a_real_token_sigma(tiny_model_dir, prepared, sigma, tmp_path):
    data = prepared("rte")
    common = dict(model=str(tiny_model_dir), data_dir=str(data), method="istar", lam=-1.0, zeta=0.2, epochs=2,
                  batch_size=16, shrinkage_rows=2000, learning_rate=1e-4, tokens="all_positions")
    with pytest.raises(ValueError, match="tokens 'real' where 'all_positions' is expected; compute it again"):
        train(TrainSpec(**common, output_dir=str(tmp_path / "wrong"), sigma_s=str(sigma("rte"))))
    allpos = tmp_path / "sigma_allpos.pt"
    compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(data), out=str(allpos),
                                         tokens="all_positions", rows=2000, batch_size=16))
    out = tmp_path / "run"
    report = train(TrainSpec(**common, output_dir=str(out), sigma_s=str(allpos)))
    assert report["tokens"] == "all_positions"
    assert json.loads((out / "run_config.json").read_text())["tokens"] == "all_positions"
    log = read_log(out / "train_log.csv")
    assert {row["penalty_tokens"] for row in log} == {"all_positions"}
    # per step: every position of the batch padded to its longest sequence (no multiple of 8), in each of the 2 layers
    from istar.data import read_split
    from istar.data.encoding import EpochShuffleSampler
    from istar.models.loading import load_tokenizer

    frame, tokenizer = read_split(data, "train"), load_tokenizer(str(tiny_model_dir))
    lengths = [len(ids) for ids in tokenizer(list(frame["text_a"]), list(frame["text_b"]), truncation=True,
                                            max_length=128)["input_ids"]]
    expected = []
    for epoch in range(2):
        sampler = EpochShuffleSampler(len(frame), 0)
        sampler.set_epoch(epoch)
        order = list(sampler)
        expected += [2 * len(order[i:i + 16]) * max(lengths[j] for j in order[i:i + 16]) for i in range(0, len(order), 16)]
    assert [float(row["penalty_rows"]) for row in log] == expected
    _, provenance = load_shrinkage(out / "sigma_epoch1.pt")
    assert provenance["tokens"] == "all_positions" and provenance["epoch"] == 1


def test_deterministic_setting_reaches_the_step_and_run_config(tiny_model_dir, prepared, tmp_path):
    """training.deterministic: config → the run's spec → PyTorch's deterministic algorithms while it trains
    (recorded in run_config.json), and the caller's setting back afterwards."""
    from istar.config.layout import Setting
    from istar.pipeline.plan import train_spec
    from istar.pipeline.validate import validate_config

    assert validate_config({}, check_paths=False)["training"]["deterministic"] is False
    config = validate_config({"training": {"deterministic": True, "epochs": 1, "batch_size": 16}}, check_paths=False)
    spec = train_spec(config, model=str(tiny_model_dir), task="rte", setting=Setting("base"), seed=0,
                      data_dir=str(prepared("rte")), output_dir=str(tmp_path / "run"), sigma_s=None)
    assert spec.deterministic is True
    train(dataclasses.replace(spec, shrinkage_rows=1000))
    recorded = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert recorded["deterministic"] is True and recorded["compile"] == "none"
    assert recorded["determinism"] == {"algorithms": True, "cublas_workspace_config": ":4096:8"}
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_compile_setting_reaches_the_spec_and_is_refused_where_it_cannot_run(tiny_model_dir, prepared, tmp_path,
                                                                            monkeypatch):
    """training.compile: config → the run's spec (→ run_config.json with the other settings); CUDA-graph capture
    on a CPU run, and compiling on a CPU without a C++ compiler, stop the run before training in one line naming
    the setting and the fix."""
    from istar.config.layout import Setting
    from istar.pipeline.plan import train_spec
    from istar.pipeline.validate import validate_config
    from istar.steps.train_step import forward_and_loss, step_forward

    assert validate_config({}, check_paths=False)["training"]["compile"] == "none"
    with pytest.raises(Exception, match="compile"):
        validate_config({"training": {"compile": "max-autotune"}}, check_paths=False)
    config = validate_config({"training": {"compile": "reduce-overhead", "epochs": 1, "batch_size": 16}},
                             check_paths=False)
    spec = train_spec(config, model=str(tiny_model_dir), task="rte", setting=Setting("base"), seed=0,
                      data_dir=str(prepared("rte")), output_dir=str(tmp_path / "run"), sigma_s=None)
    assert spec.compile == "reduce-overhead" and TrainSpec.from_json(spec.to_json()).compile == "reduce-overhead"
    with pytest.raises(ValueError, match=r"training.compile = reduce-overhead .* CUDA device; this run is on cpu: "
                                         r"set training.compile to default"):
        train(dataclasses.replace(spec, shrinkage_rows=1000))
    assert not (tmp_path / "run" / "metrics.json").exists()

    assert step_forward("none", torch.device("cpu")) is forward_and_loss
    step_forward("reduce-overhead", torch.device("cuda"))  # compiled on its first call only: nothing runs here
    step_forward("default", torch.device("cuda"))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="install one or set training.compile: none") as refused:
        step_forward("default", torch.device("cpu"))
    problem = str(refused.value)
    assert "training.compile = default" in problem and "C++ compiler" in problem and "\n" not in problem
    with pytest.raises(ValueError, match="a C compiler"):
        step_forward("reduce-overhead", torch.device("cuda"))


def test_cuda_graphs_are_refused_with_accumulation_or_a_penalty_that_counts_padding():
    """reduce-overhead replays CUDA graphs: refused, naming both settings and the fix, with gradient accumulation
    (a replay may overwrite the accumulated gradients) and with penalty.tokens = all_positions (batch lengths cannot
    be bucketed there), both when the configuration is validated and when a run's spec is."""
    from istar.config.specs import SpecError
    from istar.pipeline.validate import validate_config

    with pytest.raises(Exception, match=r"training.compile = reduce-overhead .*gradient_accumulation_steps = 2 .*"
                                        r"set training.compile to default"):
        validate_config({"training": {"compile": "reduce-overhead", "gradient_accumulation_steps": 2}},
                        check_paths=False)
    with pytest.raises(Exception, match=r"penalty.tokens = all_positions counts padding.*penalty.tokens to real"):
        validate_config({"training": {"compile": "reduce-overhead"}, "penalty": {"tokens": "all_positions"}},
                        check_paths=False)
    validate_config({"training": {"compile": "default", "gradient_accumulation_steps": 2},
                     "penalty": {"tokens": "all_positions"}}, check_paths=False)
    spec = TrainSpec(model="m", data_dir="d", output_dir="o", compile="reduce-overhead", gradient_accumulation_steps=2)
    with pytest.raises(SpecError, match="gradient_accumulation_steps = 2"):
        spec.validate()


def test_compiled_batches_are_bucketed_unless_padding_is_counted():
    from istar.registry.precisions import PRECISIONS
    from istar.steps.train import batch_pad_multiple

    spec = TrainSpec(model="m", data_dir="d", output_dir="o")
    assert batch_pad_multiple(spec, PRECISIONS["no"]) is None and batch_pad_multiple(spec, PRECISIONS["fp16"]) == 8
    assert batch_pad_multiple(dataclasses.replace(spec, compile="default"), PRECISIONS["no"]) == 32
    padded = dataclasses.replace(spec, compile="default", method="istar", lam=-1.0, zeta=0.0, tokens="all_positions")
    assert batch_pad_multiple(padded, PRECISIONS["fp16"]) is None

