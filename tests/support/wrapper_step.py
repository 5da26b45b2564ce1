"""One optimizer step of ``IStarModel`` in a plain ``transformers.Trainer``, split into its task and penalty parts.

A tiny model built from a config (random weights, dropout off), a fixed Σ_S, no gradient clipping: the gradient the
Trainer hands its optimizer is g = a·T + b·P, where T and P are the hand-computed means, over the step's micro-batches
(and processes), of the gradients of each micro-batch's mean task loss and of its penalty — the proportion of
``IStarTrainer`` and of the plain loop. The least-squares (a, b) is what :func:`step_split` returns: (1, 1) when
λ means the same. Used by tests/fast/integrations/test_integrations.py and, under two gloo ranks, run as a script
(``torchrun --nproc_per_node 2 wrapper_step.py OUT``, two micro-batches per step on each rank) by tests/integration/test_integrations.py.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import istar

WIDTH = 16


def tiny_model(kind: str):
    """A classifier (BERT) or a causal LM (GPT-2) of width 16, random weights, no dropout."""
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if kind == "classifier":
        return BertForSequenceClassification(BertConfig(
            vocab_size=100, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2))
    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=WIDTH, n_layer=2, n_head=2, n_positions=64,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def rows(kind: str, count: int) -> list[dict]:
    """``count`` sequences of 3 to 9 tokens (so micro-batches hold different numbers of label tokens)."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 10, (count,), generator=generator).tolist()
    return [{"input_ids": torch.randint(0, 100, (length,), generator=generator).tolist(),
             **({"labels": index % 2} if kind == "classifier" else {})} for index, length in enumerate(lengths)]


def collate(batch: list[dict]) -> dict:
    """Right-padded ``input_ids``, ``attention_mask``, and ``labels`` (a causal LM's: the ids, −100 at padding)."""
    width = max(len(row["input_ids"]) for row in batch)
    ids = torch.tensor([row["input_ids"] + [0] * (width - len(row["input_ids"])) for row in batch])
    mask = torch.tensor([[1] * len(row["input_ids"]) + [0] * (width - len(row["input_ids"])) for row in batch])
    labels = torch.tensor([row["labels"] for row in batch]) if "labels" in batch[0] else ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def step_split(tmp_path, kind: str, accumulation: int) -> dict:
    """Train one optimizer step of the wrapped tiny model and split its gradient into (task, penalty) multiples.

    Returns ``{"task": a, "penalty": b, "residual": |g − a·T − b·P| / |g|, "isoscore_star": the logged mean}``; under
    an initialised process group T and P are averaged over processes (the data-parallel gradient).
    """
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Capture(TrainerCallback):
        """The gradient the optimizer is about to apply."""

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.gradient = _flat([p.grad for p in model.parameters()], list(model.parameters()))

    model = tiny_model(kind)
    reference = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(2)
    spread = torch.randn(WIDTH, WIDTH, generator=generator, dtype=torch.float64)
    config = istar.IStarConfig(lam=-1.0, zeta=0.5, sigma_s=spread @ spread.T / WIDTH, recompute_shrinkage=False)
    wrapped = istar.IStarModel(model, config)
    batches = []
    model.register_forward_pre_hook(lambda module, args, kwargs: batches.append(
        {key: kwargs[key] for key in ("input_ids", "attention_mask", "labels")}), with_kwargs=True)
    processes = dist.get_world_size() if dist.is_initialized() else 1
    capture = Capture()
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=accumulation,
                             max_steps=1, learning_rate=1e-3, max_grad_norm=0.0, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0)
    trainer = Trainer(model=wrapped, args=args, train_dataset=Dataset.from_list(rows(kind, 2 * accumulation * processes)),
                      data_collator=collate, callbacks=[istar.IStarCallback(), capture])
    trainer.train()
    assert len(batches) == accumulation, len(batches)

    parameters = list(reference.parameters())
    task, penalty = torch.zeros_like(capture.gradient), torch.zeros_like(capture.gradient)
    for batch in batches:
        outputs = reference(**batch, output_hidden_states=True)
        term = config.penalty(outputs.hidden_states, batch["attention_mask"], config.sigma_s).term
        task += _flat(torch.autograd.grad(outputs.loss, parameters, retain_graph=True, allow_unused=True), parameters)
        penalty += _flat(torch.autograd.grad(term, parameters, allow_unused=True), parameters)
    parts = torch.stack([task, penalty], dim=1) / (accumulation * processes)
    if processes > 1:
        dist.all_reduce(parts)
    split = torch.linalg.lstsq(parts.double(), capture.gradient.double().unsqueeze(1)).solution.flatten()
    residual = (capture.gradient.double() - parts.double() @ split).norm() / capture.gradient.double().norm()
    logged = next(entry["isoscore_star"] for entry in trainer.state.log_history if "isoscore_star" in entry)
    return {"task": float(split[0]), "penalty": float(split[1]), "residual": float(residual), "isoscore_star": logged}


def _flat(gradients, parameters) -> torch.Tensor:
    """The gradients as one vector, zeros where a parameter took no part (the classifier's head in the penalty)."""
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(gradients, parameters)])


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out = Path(sys.argv[1])
    found = {kind: step_split(out / f"{kind}-rank{dist.get_rank()}", kind, accumulation=2)
             for kind in ("classifier", "causal_lm")}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"world_size": dist.get_world_size(), **found}))
    dist.destroy_process_group()
