"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/report/test_aggregate.py, tests/integration/test_aggregate.py."""

import json
import shutil
from pathlib import Path

import pytest

from istar.config.specs import MeasureSpec
from istar.io import artifacts
from istar.report.aggregate import aggregate
from istar.report.select import select_best
from istar.steps.measure import measure_runs

# the runs of conftest.TINY_RUNS that are measured into one file
ANALYSED = [("base", 0), ("cosreg_lam1", 0), ("istar_lam-1_zeta0.2", 0)]


@pytest.fixture(scope="module")
def runs(tiny_runs, tiny_sigma, prepared, tmp_path_factory):
    """The session's tiny runs (conftest.TINY_RUNS) copied into this module's root, where the search
    runs go beside them, and the analysed ones measured into one file."""
    root = tmp_path_factory.mktemp("aggregate")
    shutil.copytree(tiny_runs["root"], root, dirs_exist_ok=True)
    folders = {key: root / folder.relative_to(tiny_runs["root"]) for key, folder in tiny_runs["folders"].items()}
    measures = root / "measures.json"
    measure_runs(MeasureSpec(runs=[str(folders[key]) for key in ANALYSED], data_dir=str(prepared("rte")),
                             sigma_s=str(tiny_sigma("rte")), out=str(measures)))
    return {"root": root, "folders": folders, "measures": measures}


def fake_run(template: Path, out: Path, seed: int, score: float, lam: float = -1.0, zeta: float = 0.2,
             task: str = "rte") -> Path:
    """A run folder whose metrics.json is a real run's, edited by hand for a controlled score."""
    out.mkdir(parents=True)
    shutil.copy(template / "run_config.json", out / "run_config.json")
    metrics = json.loads((template / "metrics.json").read_text())
    metrics.update(seed=seed, lam=lam, zeta=zeta, task=task)
    metrics["final"]["accuracy"] = score
    artifacts.write_json(out / "metrics.json", metrics, digest=True)  # a new hash: readers check it
    return out


@pytest.fixture(scope="module")
def search(runs):
    """Search runs of tiny × rte with known scores; the setting λ = −3 wins on the mean over seeds."""
    template = runs["folders"][("istar_lam-1_zeta0.2", 0)]
    base = runs["root"] / "results" / "search" / "tiny" / "rte"
    return [
        fake_run(template, base / "istar_lam-1_zeta0.2" / "seed0", 0, 0.9),  # best single run ...
        fake_run(template, base / "istar_lam-1_zeta0.2" / "seed1", 1, 0.5),  # ... but mean 0.7
        fake_run(template, base / "istar_lam-3_zeta0.4" / "seed0", 0, 0.75, lam=-3.0, zeta=0.4),
        fake_run(template, base / "istar_lam-3_zeta0.4" / "seed1", 1, 0.85, lam=-3.0, zeta=0.4),  # mean 0.8
        fake_run(template, base / "istar_lam-5_zeta0.2" / "seed0", 0, 0.6, lam=-5.0),
    ]


# ------------------------------------------------------------------------------------- aggregate


@pytest.fixture(scope="module")
def aggregated(runs, search, tmp_path_factory):
    folders = runs["folders"]
    out = tmp_path_factory.mktemp("aggregate-out")
    best = select_best(search, out=out / "best.json")
    specs = [("final", path) for (setting, _), path in folders.items() if not setting.endswith("layer2")]
    specs += [("single_layer", folders[("istar_lam-1_zeta0.2_layer2", 0)]),
              ("lambda_sweep", folders[("istar_lam-1_zeta0.2", 0)]), ("final", folders[("base", 0)])]  # a duplicate
    specs += [("search", path) for path in search]
    frames = aggregate(specs, [out / "best.json"], out / "csv", [runs["measures"]])
    return {"frames": frames, "out": out / "csv", "best": best, "folders": folders, "runs": runs}
