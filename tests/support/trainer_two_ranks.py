"""Run under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=true (two gloo ranks): the
I-STAR Trainer with the global penalty on MiniLM and a few SST-2 rows. Each rank writes what it saw to
OUT/rank{r}.json (the folder is the first argument)."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

import istar
from trainer_runs import trainer_for


def main(out: str) -> None:
    trainer = trainer_for(Path(out) / "run", istar.IStarConfig(lam=-1.0, zeta=0.2, shrinkage_rows=2000, global_penalty=True),
                          num_train_epochs=1, per_device_train_batch_size=4)
    trainer.train()
    result = trainer.evaluate()
    record = {"world_size": dist.get_world_size(), "sigma_checksum": float(trainer.sigma_s.sum()),
              "logs": [entry for entry in trainer.state.log_history if "isoscore_star" in entry],
              "eval_accuracy": result["eval_accuracy"]}
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1])
