"""Loading any pretrained model for ``istar survey``: encoders, causal LMs, GGUF files.

- An encoder (config ``architectures`` without a causal-LM head, e.g. BERT) loads with
  ``AutoModel``; it has only an input embedding matrix.
- A causal LM (``*ForCausalLM``, ``*LMHeadModel``: GPT-NeoX/Pythia, GPT-2, OPT, Llama, …)
  loads with ``AutoModelForCausalLM``; its input and output matrices are measured, and where they
  are one shared (tied) matrix, as in OPT and Falcon, it is measured once under the label
  ``output``, as Machina & Mercer's code labels it (docs/method.md §7). The forward passes run
  the backbone only (no logits).
- A model whose repository ships its own modelling code (CrystalCoder) loads only with
  ``trust_remote_code`` (``survey.models.NAME.trust_remote_code``), which runs that code.
- A ``.gguf`` file (a path, or ``package:NAME/FILE.gguf`` inside an installed package)
  loads through transformers' GGUF reader (needs the ``gguf`` package; quantised weights
  are dequantised to float32).

Everything else (hub ids, local folders, ``package:`` folders) is resolved by
:func:`istar.models.loading.resolve_model_source`; a revision is passed to ``from_pretrained``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from istar.io import artifacts
from istar.io.revisions import resolve_revision
from istar.models.loading import gguf_location, resolve_model_source
from istar.registry.precisions import run_dtype

__all__ = ["LoadedModel", "load_for_survey", "find_final_norm", "parameter_count"]

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
FINAL_NORM_NAMES = ("final_layer_norm", "ln_f", "norm", "final_norm", "norm_f")
"""Attribute names under which architectures keep the norm after the last block."""


@dataclass
class LoadedModel:
    model: torch.nn.Module  # the whole model (for parameters and the output matrix)
    backbone: torch.nn.Module  # what the forward passes run (hidden states, no head)
    tokenizer: object
    device: torch.device
    input_embeddings: torch.Tensor  # (V, d)
    output_embeddings: torch.Tensor | None  # (V, d), None if tied or absent
    has_output_matrix: bool
    final_norm: torch.nn.Module | None
    final_norm_name: str | None
    num_layers: int
    hidden_size: int
    provenance: dict

    @property
    def static_matrices(self) -> dict[str, torch.Tensor]:
        """The embedding matrices the survey measures, by label: an encoder's input matrix; a causal
        LM's input and output matrices, or its one shared matrix as ``output`` (Machina & Mercer's
        label for OPT's and Falcon's: ``emb_in = None``, the shared matrix as ``emb_out``)."""
        if self.output_embeddings is not None:
            return {"input": self.input_embeddings, "output": self.output_embeddings}
        return {"output" if self.has_output_matrix else "input": self.input_embeddings}


def find_final_norm(backbone: torch.nn.Module) -> tuple[str | None, torch.nn.Module | None]:
    """The norm applied after the last block: a direct child of the backbone (or of its decoder).

    Per-block norms sit inside numbered layer lists and are never chosen; BERT-style
    encoders (post-LN inside each block) have none.
    """
    for prefix, parent in (("", backbone), ("decoder.", getattr(backbone, "decoder", None))):
        if parent is None:
            continue
        for name in FINAL_NORM_NAMES:
            module = getattr(parent, name, None)
            if isinstance(module, torch.nn.Module):
                return prefix + name, module
    return None, None


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied matrices counted once)."""
    return sum({parameter.data_ptr(): parameter.numel() for parameter in model.parameters()}.values())


def load_for_survey(spec) -> LoadedModel:
    """Load the model and tokenizer a :class:`~istar.steps.survey.SurveySpec` names, in eval mode on its device."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if spec.device == "auto" else spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec.device!r} asked for, but torch sees no CUDA GPU here: use --device cpu or auto")
    # On a CPU a reduced dtype runs as bfloat16 where the processor has it natively, else float32.
    dtype_name = run_dtype(spec.dtype, device.type)
    dtype = getattr(torch, dtype_name)
    gguf = gguf_location(spec.model)
    file = gguf[0] / gguf[1] if gguf is not None else None  # a GGUF file loads from its folder, by name
    location = str(file.parent) if file is not None else resolve_model_source(spec.model)
    local = file is not None or Path(location).is_dir()
    if local and spec.revision:
        raise ValueError(f"model source {spec.model!r} is a {'GGUF file' if file else 'local folder'}: it has no "
                         "revisions (drop --revision)")
    # Load by commit: a branch (Pythia's step143000) may move, and the commit is what was measured.
    commit = None if local else resolve_revision(location, spec.revision)
    kwargs = {"local_files_only": local, "trust_remote_code": spec.trust_remote_code,
              **({"revision": commit} if commit else {}), **({"gguf_file": file.name} if file else {})}
    provenance = {"model": spec.model, "revision": spec.revision, "model_path": str(file or location), "commit": commit,
                  **({"file_sha256": artifacts.file_digest(file), "format": "gguf (dequantised)"} if file
                     else {"format": "transformers"})}
    try:
        config = AutoConfig.from_pretrained(location, **kwargs)
    except ValueError as error:
        if "trust_remote_code" not in str(error) or spec.trust_remote_code:
            raise
        raise ValueError(f"{spec.model} ships its own model code, which runs only when allowed: set "
                         "trust_remote_code: true for it under survey.models (istar survey: --trust-remote-code), "
                         "having read that code") from None
    # A causal LM (which has an output matrix) by its architecture's name; GGUF configs carry no
    # ``architectures`` (a PretrainedConfig's default is None), and every architecture GGUF stores is a causal LM.
    causal = file is not None or any(name.endswith(CAUSAL_SUFFIXES) for name in config.architectures or ())
    loader = AutoModelForCausalLM if causal else AutoModel
    model = loader.from_pretrained(location, dtype=dtype, **kwargs).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    if tokenizer.pad_token is None:
        # Decoders often ship without a pad token; padded positions are masked out anyway.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    backbone = model.base_model if causal else model
    inputs = model.get_input_embeddings().weight
    output_layer = model.get_output_embeddings() if causal else None
    outputs = output_layer.weight if output_layer is not None else None
    tied = outputs is not None and (outputs.data_ptr() == inputs.data_ptr() or torch.equal(outputs, inputs))
    norm_name, norm = find_final_norm(backbone)
    return LoadedModel(
        model=model, backbone=backbone, tokenizer=tokenizer, device=device,
        input_embeddings=inputs, output_embeddings=None if tied else outputs, has_output_matrix=outputs is not None,
        final_norm=norm, final_norm_name=norm_name, num_layers=int(model.config.num_hidden_layers),
        hidden_size=int(inputs.shape[1]), provenance={**provenance, "architecture": type(model).__name__,
                                                      "causal": causal, "dtype": dtype_name, "dtype_requested": spec.dtype,
                                                      "device": str(device), "trust_remote_code": spec.trust_remote_code},
    )
