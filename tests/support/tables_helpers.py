"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/report/test_tables.py, tests/integration/test_tables.py."""

import numpy as np
import pandas as pd

SETTINGS = {"base": ("base", 0.0, np.nan), "cosreg": ("cosreg_lam1", 1.0, np.nan),
            "istar": ("istar_lam-1_zeta0.2", -1.0, 0.2)}

# model → method → task → per-seed headline scores (fractions; SQuAD: F1 in percent)
SCORES = {
    "bert": {
        "base": {"rte": [0.70, 0.72, 0.74], "cola": [0.55, 0.57, 0.56], "squad": [87.0, 88.0, 89.0]},
        "cosreg": {"rte": [0.66, 0.68, 0.64], "cola": [0.50, 0.52, 0.51], "squad": [86.0, 86.5, 87.0]},
        "istar": {"rte": [0.73, 0.75, 0.71], "cola": [0.58, 0.60, 0.59], "squad": [88.0, 88.5, 88.6]},
    },
    "distil_bert": {  # one seed each, an underscore in the name
        "base": {"rte": [0.60], "cola": [0.45], "squad": [80.0]},
        "cosreg": {"rte": [0.61], "cola": [0.44], "squad": [80.4]},
        "istar": {"rte": [0.61], "cola": [0.47], "squad": [79.0]},
    },
}


def make_runs() -> pd.DataFrame:
    rows = []
    for model, methods in SCORES.items():
        for method, by_task in methods.items():
            setting, lam, zeta = SETTINGS[method]
            for task, scores in by_task.items():
                for seed, score in enumerate(scores):
                    rows.append(dict(
                        study="final", model=model, task=task, method=method, setting=setting, lam=lam, zeta=zeta,
                        layer=np.nan, batch_size=32, epochs=3, learning_rate=3e-5, seed=seed,
                        metric={"rte": "accuracy", "cola": "matthews", "squad": "f1"}[task], score=score,
                        accuracy=score if task == "rte" else np.nan, f1=score if task == "squad" else np.nan,
                        exact_match=score - 8.0 if task == "squad" else np.nan,
                        matthews=score if task == "cola" else np.nan, pearson=np.nan, spearman=np.nan,
                        eval_loss=0.5, standin=task == "rte", isoscore_star=0.1, isoscore=0.05,
                        cosine_similarity=0.3, run_dir=f"results/runs/{model}/{task}/{setting}/seed{seed}"))
    # a search row that must be ignored by Table 1
    rows.append({**rows[0], "study": "search", "score": 0.99, "setting": "istar_lam-5_zeta0.8", "method": "istar"})
    return pd.DataFrame(rows)


def make_selection() -> pd.DataFrame:
    return pd.DataFrame([
        dict(model="bert", task="sst2", metric="accuracy", lam=-1.0, zeta=0.2, batch_size=32, epochs=3,
             learning_rate=3e-5, score=0.92, score_std=0.003, seeds=3, standin=False),
        dict(model="bert", task="rte", metric="accuracy", lam=-5.0, zeta=0.6, batch_size=16, epochs=4,
             learning_rate=1e-5, score=0.7, score_std=0.01, seeds=3, standin=True),
        dict(model="albert", task="sst2", metric="accuracy", lam=-3.0, zeta=0.4, batch_size=8, epochs=5,
             learning_rate=5e-5, score=0.93, score_std=0.002, seeds=3, standin=False),
        dict(model="albert", task="rte", metric="accuracy", lam=-1.0, zeta=0.8, batch_size=8, epochs=5,
             learning_rate=5e-5, score=0.72, score_std=0.02, seeds=3, standin=True),
    ])
