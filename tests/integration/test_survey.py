"""istar survey: the measures against independent computations, on real models (MiniLM, a GGUF decoder)."""

import json

import numpy as np
import pytest
import torch
from fixture_parts import MINILM
from survey_helpers import check_static_independently, minilm_profile
from survey_helpers import text_file  # noqa: F401 (a fixture minilm_profile requests)

from istar.steps.survey import static_measures


def numpy_average_cosine(W: np.ndarray) -> float:
    """Mean of the off-diagonal of the explicit cosine-similarity matrix."""
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    gram = unit @ unit.T
    n = len(W)
    return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def test_minilm_static_embeddings_match_an_independent_computation(minilm_profile):
    from transformers import AutoModel

    from istar.models.loading import resolve_model_source

    W = AutoModel.from_pretrained(resolve_model_source(MINILM)).get_input_embeddings().weight.detach().double().numpy()
    assert set(minilm_profile["static"]) == {"input"}  # an encoder has no output matrix here
    check_static_independently(minilm_profile["static"]["input"], W)
    # average cosine, explicitly over all pairs, on a slice small enough for the full Gram matrix
    assert static_measures(torch.from_numpy(W[:1500]))["average_cosine"] == pytest.approx(
        numpy_average_cosine(W[:1500]), abs=1e-10)


# ------------------------------------------------------------------ istar survey-check


AUTHORS_SCRIPT = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], revision=sys.argv[2], dtype=torch.float32)

def iw(W):  # as Machina & Mercer's script: float32, eigh's signs, plain exp
    vectors = torch.linalg.eigh(torch.mm(W.T, W)).eigenvectors
    z = torch.exp(torch.mm(W, vectors)).sum(dim=0)
    return (z.min() / z.max()).item()

with torch.no_grad():
    # gpt_neox.embed_in and embed_out in the authors' transformers; this one's names may differ
    W_in, W_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    print(json.dumps({"input": iw(W_in), "output": iw(W_out), "input_centred": iw(W_in - W_in.mean(0)),
                      "output_centred": iw(W_out - W_out.mean(0))}))
"""


def test_profile_check_passes_and_fails_on_the_tiny_neox(hub, tmp_path):
    """The one-command check, run as a user runs it, on the test hub's GPT-NeoX at step1000 against
    values from the authors' recipe computed in another process; then against values 2e-4 off."""
    import os
    import subprocess
    import sys

    from fixture_parts import HUB_DECODER

    env = {**os.environ, **hub.env(tmp_path / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    authors = subprocess.run([sys.executable, "-c", AUTHORS_SCRIPT, HUB_DECODER, hub.decoder_commits["step1000"]],
                             env=env, capture_output=True, text=True)
    assert authors.returncode == 0, authors.stderr[-3000:]
    expected = json.loads(authors.stdout)

    def check(reference):
        return subprocess.run([sys.executable, "-m", "istar", "survey-check", "--model", HUB_DECODER, "--revision",
                               "step1000", "--device", "cpu", "--out", str(tmp_path / "check.json"),
                               *(f"--reference={name}={value!r}" for name, value in reference.items())],
                              env=env, capture_output=True, text=True, timeout=600)

    result = check(expected)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" pass") == 4 and result.stdout.rstrip().endswith("PASS")
    profile = json.loads((tmp_path / "check.json").read_text())
    assert profile["provenance"]["commit"] == hub.decoder_commits["step1000"]
    result = check({**expected, "output_centred": expected["output_centred"] + 2e-4})
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.endswith("FAIL") and "output_centred" in line]
    assert len(failed) == 1 and "difference -2.00e-04" in failed[0] and result.stdout.count(" pass") == 3
