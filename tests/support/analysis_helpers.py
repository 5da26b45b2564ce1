"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/steps/test_analysis.py, tests/integration/test_analysis.py."""

import pytest
import torch

from istar.config.specs import MeasureSpec, TrainSpec
from istar.steps.activations import activation_statistics
from istar.steps.common import open_model_context
from istar.steps.measure import measure_runs
from istar.steps.train import train


ZETA = 0.2


@pytest.fixture(scope="module")
def run(tiny_model_dir, prepared, tiny_sigma, tmp_path_factory):
    """A fine-tuned run, the spec measuring it alone, its activation statistics as that measurement takes them
    (tensors, metadata), the pretrained Σ_S, and the token vectors computed directly."""
    from istar.data import read_split
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task

    root = tmp_path_factory.mktemp("analysis")
    data = prepared("rte")
    sigma = tiny_sigma("rte")
    out = root / "run"
    train(TrainSpec(model=str(tiny_model_dir), data_dir=str(data), output_dir=str(out), method="istar", lam=-1.0,
                    zeta=ZETA, sigma_s=str(sigma), epochs=1, batch_size=16, learning_rate=1e-3))
    spec = MeasureSpec(runs=[str(out)], data_dir=str(data), out=str(root / "measures.json"), sigma_s_model="pretrained",
                       sigma_s=str(sigma), zeta=ZETA, evaluate=True)
    statistics = activation_statistics(open_model_context(spec.model_data(str(out))), spec.split, spec.batch_size)

    frame = read_split(data, "validation")
    tokenizer = load_tokenizer(str(out / "model"))
    model = load_model(str(out / "model"), get_task("rte")).eval()
    batch = tokenizer(list(frame["text_a"]), list(frame["text_b"]), truncation=True, max_length=128, padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].bool()
    return {"spec": spec, "sigma": sigma, "statistics": statistics, "root": root, "run": out, "data": data,
            "tokens": [s[mask].double() for s in states], "cls": [s[:, 0].double() for s in states]}


@pytest.fixture(scope="module")
def measured(run):
    """What ``istar measure`` writes for the run alone (evaluated, analysed against the pretrained Σ_S)."""
    return measure_runs(run["spec"])


@pytest.fixture(scope="module")
def result(run, measured):
    """The run's analysis, as the measurement holds it."""
    return measured["runs"][str(run["run"])]["analysis"]
