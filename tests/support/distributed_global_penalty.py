"""Run under `torchrun --nproc_per_node 2` (gloo): the global IsoScore* penalty of two ranks
equals IsoScore* of the union of their rows, and its gradients equal the single-process ones.
Writes rank 0's findings as JSON to the path given as the first argument."""

import json
import sys

import torch
import torch.distributed as dist

from istar.cli import end_process_group
from istar.core.isotropy import isoscore_star
from istar.core.regularizers import global_isoscore_star


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(400, 16, generator=g, dtype=torch.float64) * torch.linspace(0.2, 3.0, 16, dtype=torch.float64) + 5.0
    sigma_s = torch.cov(torch.randn(2000, 16, generator=g, dtype=torch.float64).T)
    local = rows[rank * 150: (rank + 1) * 150 + rank * 100].clone().requires_grad_()  # 150 and 250 rows
    score = global_isoscore_star(local, 0.3, sigma_s)
    score.backward()
    # Each process adds the same global score to its loss; data-parallel training averages the
    # parameter gradients over processes, so the penalty's gradient is the mean over ranks.
    padded = torch.zeros(250, 16, dtype=torch.float64)
    padded[: local.shape[0]] = local.grad.double()
    gathered = [torch.zeros(250, 16, dtype=torch.float64) for _ in range(2)]
    dist.all_gather(gathered, padded)
    grads = [gathered[0][:150], gathered[1][:250]]
    if rank == 0:
        everything = rows.clone().requires_grad_()
        reference = isoscore_star(everything, 0.3, sigma_s)
        reference.backward()
        averaged = torch.cat(grads) / 2  # the data-parallel average of each rank's gradient
        with open(out, "w") as handle:
            json.dump({"global": score.item(), "reference": reference.item(),
                       "max_grad_error": float((averaged - everything.grad).abs().max()),
                       "max_grad": float(everything.grad.abs().max())}, handle)
    # End cleanly: drop the autograd graphs first (an autograd context that holds the process
    # group would keep it alive past destroy_process_group, to be torn down at interpreter exit),
    # then meet and tear the group down together, as `istar` does after every step.
    del score, local
    end_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
