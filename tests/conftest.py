"""Shared fixtures: tiny randomly initialised models built from a config (no download), data prepared from
the test data (tests/data), runs and workflow projects built once per session, and a local hub server.
Fixtures only: what they are built from (and the names tests import) is tests/support/fixture_parts.py; the
lanes by cost and their limits, the order modules go out in and the session's istar cache are the plugins of
tests/support (lane_rules, module_timing, session_cache)."""

import shutil
from pathlib import Path

import pytest
import torch
from fixture_parts import HUB_DECODER, HUB_ENCODERS, HUB_MODEL, MINILM, TINY_RUNS, built_once, tiny_bert_config
from mirrors import TEST_DATA
from transformers import BertModel

pytest_plugins = ["lane_rules", "module_timing", "session_cache"]


@pytest.fixture
def tiny_bert():
    torch.manual_seed(0)
    return BertModel(tiny_bert_config()).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny randomly initialised BERT (2 layers, d = 32) with the packaged MiniLM tokenizer, saved to disk."""
    from istar.models.loading import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertModel(tiny_bert_config(vocab_size=30522, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                               max_position_embeddings=512)).save_pretrained(path)
    load_tokenizer(MINILM).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """prepared(task, train, eval) -> folder with a subsampled task from the test data (stand-in where needed)."""
    from istar.data import prepare_task

    cache = {}

    def make(task, train=48, evaluation=24):
        key = (task, train, evaluation)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"data-{task}")
            prepare_task(task, out, source="mirror", mirror=TEST_DATA, subset=True, allow_standin=True,
                         max_train_samples=train, max_eval_samples=evaluation, seed=0)
            cache[key] = out
        return cache[key]

    return make


# ------------------------------------------------------------ trained once per session

@pytest.fixture(scope="session")
def tiny_sigma(tiny_model_dir, prepared, tmp_path_factory):
    """tiny_sigma(task) -> the Σ_S file of the tiny model on the task's prepared rows (all of them: the schema's row
    budget, which a run's spec expects by default, exceeds them), computed once."""
    from istar.config.specs import ShrinkageSpec
    from istar.steps.shrinkage import compute_shrinkage_file

    cache = {}

    def make(task):
        if task not in cache:
            out = tmp_path_factory.mktemp(f"sigma-{task}") / "sigma0.pt"
            compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(prepared(task)), out=str(out),
                                                 batch_size=32))
            cache[task] = out
        return cache[task]

    return make


@pytest.fixture(scope="session")
def tiny_runs(tiny_model_dir, prepared, tiny_sigma, tmp_path_factory):
    """The finished runs of ``TINY_RUNS``, trained in-process once per session in the workflow's layout
    ``ROOT/results/runs/tiny/rte/{setting}/seed{seed}``: {"root": ROOT, "folders": {(setting, seed): folder}}.

    Shared by every test that reads them: copy a run (or the root) before changing anything in it.
    """
    from istar.config.specs import TrainSpec
    from istar.steps.train import train

    root = tmp_path_factory.mktemp("tiny-runs")
    folders = {}
    for setting, method, lam, layers, seed in TINY_RUNS:
        out = root / "results" / "runs" / "tiny" / "rte" / setting / f"seed{seed}"
        train(TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(out), method=method,
                        lam=lam, zeta=0.2, layers=layers, sigma_s=str(tiny_sigma("rte")), epochs=1, batch_size=16,
                        seed=seed))
        folders[(setting, seed)] = out
    return {"root": root, "folders": folders}


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """A Hugging Face-compatible hub on 127.0.0.1 (olah, see tests/support/hub_server.py) for this session.

    Serves ``sentence-transformers/all-MiniLM-L6-v2`` (the packaged MiniLM's files; branches
    ``main`` and ``v2``, which differs in its README), a tiny GPT-NeoX ``istar-test/tiny-neox`` at
    branches ``step0`` and ``step1000`` (other weights; ``decoder_commits``), tiny random ModernBERT,
    DeBERTa-v3 and RoBERTa encoders (``HUB_ENCODERS``, ``encoder_commits``) and the dataset repos of
    tests/support/hub_repos.py built from the test data. Yields the server with ``small_mirror`` (the
    mirror rows the datasets were built from), ``model_commits`` and ``dataset_commits``; use
    ``monkeypatch.setenv`` with ``hub.env(tmp_path / "hf")`` to point clients at it.
    """
    from hub_repos import dataset_repos, small_mirror, tiny_model_files
    from hub_server import HubServer, olah_command

    from istar.models.loading import resolve_model_source

    if olah_command() is None:
        pytest.skip("olah is not installed (pip install -e '.[dev]' installs olah==0.5.4)")
    root = tmp_path_factory.mktemp("hub")
    server = HubServer(root)
    minilm = Path(resolve_model_source(MINILM))
    files = {str(p.relative_to(minilm)): p for p in minilm.rglob("*") if p.is_file()}
    server.model_commits = server.add_repo("models", HUB_MODEL, {
        "main": files, "v2": {"README.md": b"MiniLM, second revision (test copy)\n"}})
    # a tiny GPT-NeoX at two "training checkpoints", as Pythia's revisions step0 … step143000
    server.decoder_commits = {
        step: server.add_repo("models", HUB_DECODER, {step: tiny_model_files("gpt_neox", root / step, seed)})[step]
        for seed, step in enumerate(("step0", "step1000"))}
    # newer encoders, tiny and random, built from their configs (tests/e2e/test_encoders.py)
    server.encoder_commits = {
        repo_id: server.add_repo("models", repo_id, {"main": tiny_model_files(kind, root / kind)})["main"]
        for kind, repo_id in HUB_ENCODERS.items()}
    server.small_mirror = small_mirror(TEST_DATA, root / "small-mirror")
    server.dataset_commits = {repo_id: server.add_repo("datasets", repo_id, {"main": content})["main"]
                              for repo_id, content in dataset_repos(server.small_mirror).items()}
    server.start(HUB_MODEL)
    print(f"hub server (olah) on {server.endpoint} answered after {server.started_in:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """The session's tiny workflow project, run to completion once (see :func:`built_once`): read it or
    copy it, never change it. Its config.yaml is .test/config/tiny.yaml with the model at an absolute path, the
    folder tiny-bert beside it, so a copy anywhere (a DVC clone too) has the same params as the original
    and Snakemake plans no job again for them."""
    from workflow_helpers import load_test_config, save_tiny_model, snakemake, write_project

    def build(workdir):
        model = save_tiny_model(workdir / "tiny-bert")
        write_project(workdir, load_test_config("tiny", model_dir=model))
        result = snakemake(workdir, "--cores", "2")
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]

    return built_once(tmp_path_factory, "tiny-project", build)


@pytest.fixture(scope="session")
def tiny_project(tiny_study, tmp_path_factory):
    """A tiny workflow project (.test/config/tiny.yaml) run to completion once per session (a few minutes
    on 2 cores; the workers share it), copied for each worker: shared by the workflow tests that only read
    it or change it and leave it finished and up to date with its config.yaml again
    (tests/e2e/test_workflow.py, test_reliability_rebuild.py)."""
    from workflow_helpers import snakemake

    workdir = tmp_path_factory.mktemp("tiny-project")
    # File times travel with the copy (copy2). Snakemake records the config file by its absolute path,
    # the input of run_config: in the copy that config and the report are made again (seconds).
    shutil.copytree(tiny_study, workdir, symlinks=True, dirs_exist_ok=True)
    result = snakemake(workdir, "--cores", "1")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return workdir


@pytest.fixture(autouse=True, scope="module")
def _fresh_accelerate_state():
    """accelerate keeps one AcceleratorState per process and refuses another precision later: each
    test module starts without one, whatever ran before it on this worker. Per module, not per
    test: a module's fixture may hold a Trainer whose Accelerator shares that state."""
    import sys

    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
    yield
