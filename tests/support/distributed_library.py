"""Run under `torchrun --nproc_per_node 2` (gloo), no accelerate: the library's merges through torch.distributed.

Each rank reads its own shard of the same batches (rank 0 two batches, rank 1 one, of other sizes); Σ_S from
``istar.shrinkage_covariance`` and the report of ``istar.IsotropyMetric`` must equal, on both ranks, what one
process computes from all batches. Each rank writes its findings as JSON to OUT/rank{r}.json (OUT: argv[1])."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import BertConfig, BertModel

import istar
from istar.cli import end_process_group


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=64)).eval()
    generator = torch.Generator().manual_seed(1)
    batches = []
    for size, length in ((4, 9), (3, 12), (5, 7)):
        mask = torch.ones(size, length, dtype=torch.long)
        mask[size // 2:, length - 3:] = 0
        batches.append({"input_ids": torch.randint(0, 100, (size, length), generator=generator), "attention_mask": mask})
    shard = batches[:2] if rank == 0 else batches[2:]
    merged = istar.shrinkage_covariance(model, shard, shrinkage_rows=10**9, progress=False)
    reference = istar.CovarianceAccumulator(16)
    metric, single = istar.IsotropyMetric(zeta=0.0), istar.IsotropyMetric(zeta=0.0)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            states = model(**batch, output_hidden_states=True).hidden_states
            mask = batch["attention_mask"].bool()
            reference.add(torch.cat([states[1][mask], states[2][mask]]))
            single.update(states, batch["attention_mask"])
            if (index < 2) == (rank == 0):
                metric.update(states, batch["attention_mask"])
    both, alone = metric.compute().to_dict(), single.compute(sync=False)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "world_size": dist.get_world_size(),
        "sigma_error": float((merged - reference.covariance()).abs().max()), "sigma_scale": float(merged.abs().max()),
        "merged_report": both, "reference_report": alone.to_dict()}))
    end_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
