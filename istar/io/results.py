"""Reading back what the steps wrote, for the steps, the report and the pipeline alike: a finished
run folder (:func:`read_finished_run`) and a measurement file (:func:`read_measures`).

``istar train`` writes, once a run is done (:mod:`istar.steps.train_outputs`)::

    OUT/model/            the fine-tuned model, with digests.json (file → sha256)
    OUT/train_log.csv
    OUT/run_config.json   settings and provenance, with its content hash (key sha256)
    OUT/metrics.json      last: the completion mark, with its content hash and model_sha256,
                          the sha256 of model/digests.json (the model these metrics belong to)

Every later step that trusts these files reads them through :func:`read_finished_run`, which
refuses a changed file (content hash), a ``model/`` of another run (``model_sha256``), and a
folder that also holds a saved training state (``resume/``): a training of the folder is then
running or was interrupted, and its outputs would be mixed with the finished run's. Before
training starts, :func:`istar.steps.run_folder.clear_earlier_outputs` removes the finished
outputs of an earlier run of the folder.

``istar measure`` writes one file per setting and set of seeds (:mod:`istar.steps.measure`).
"""

from __future__ import annotations

from pathlib import Path

from istar.io import artifacts

__all__ = ["METRICS", "RUN_CONFIG", "MODEL", "TRAIN_LOG", "model_sha256", "read_finished_run", "read_measures"]

METRICS, RUN_CONFIG, MODEL, TRAIN_LOG = "metrics.json", "run_config.json", "model", "train_log.csv"


def model_sha256(model_dir) -> str:
    """sha256 of a saved model folder's ``digests.json``: one hash for every file of the model."""
    return artifacts.file_digest(Path(model_dir) / artifacts.DIGESTS)


def _rebuild(run_dir: Path) -> str:
    return f"train it again (`snakemake --forcerun {run_dir / METRICS}`, or `istar train … --out {run_dir}`)"


def read_finished_run(run_dir) -> tuple[dict, dict]:
    """``(metrics, run_config)`` of a finished run folder, after checking that they belong together.

    Raises ``ValueError`` (:class:`istar.io.artifacts.DamagedArtifactError` for a changed file)
    naming the folder, the problem and the fix, when ``metrics.json`` or ``run_config.json``
    is missing, changed or has no content hash, when ``model/`` is not the model the metrics
    were measured on, or when the folder holds a saved training state.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    metrics_path, config_path = run_dir / METRICS, run_dir / RUN_CONFIG
    if not metrics_path.is_file():
        raise ValueError(f"run folder {run_dir} has no {METRICS}: {METRICS} is written last, so the run did not "
                         "finish (rerun or resume it)")
    if not config_path.is_file():
        raise ValueError(f"run folder {run_dir} has {METRICS} but no {RUN_CONFIG}: the run folder is incomplete; "
                         + _rebuild(run_dir))
    metrics = artifacts.read_json(metrics_path, metrics_path)
    config = artifacts.read_json(config_path, metrics_path)
    for path, data in ((metrics_path, metrics), (config_path, config)):
        if not isinstance(data, dict) or "sha256" not in data:
            raise artifacts.DamagedArtifactError(path, "it carries no content hash: written by an older istar, "
                                                       "or rewritten by hand", metrics_path)
    states = sorted(p.name for p in (run_dir / "resume").glob("state-*"))  # none where there is no resume/
    if states:
        raise ValueError(f"run folder {run_dir} holds a saved training state (resume/{states[-1]}) beside the outputs "
                         f"of a finished run: a training of this folder is running or was interrupted, possibly with "
                         f"other settings; finish it (run the same `istar train` again) or remove {run_dir / 'resume'}")
    if metrics.get("fingerprint") != config.get("fingerprint"):
        raise ValueError(f"run folder {run_dir} mixes two runs: {METRICS} (fingerprint {metrics.get('fingerprint')}) "
                         f"and {RUN_CONFIG} ({config.get('fingerprint')}); " + _rebuild(run_dir))
    model_dir = run_dir / MODEL
    if model_dir.is_dir():
        recorded = metrics.get("model_sha256")
        actual = model_sha256(model_dir) if (model_dir / artifacts.DIGESTS).is_file() else None
        if recorded is None or actual != recorded:
            raise ValueError(f"run folder {run_dir} mixes two runs: {model_dir} is not the model {METRICS} was "
                             "measured on (its digests.json differs from the model_sha256 recorded there); "
                             + _rebuild(run_dir))
    return metrics, config


def read_measures(path, expected: dict | None = None) -> dict[str, dict]:
    """The runs of a measurement file, keyed by run folder, each with ``evaluation`` and ``analysis`` (whose
    ``zeta`` is the file's: the ζ its IsoScore* used), hash checked; a file not written by ``istar measure`` is
    named in the error. ``expected``: the analysis settings the reader needs (``zeta``, ``sigma_s_model``,
    ``sigma_s``); a file measured with another value of one is refused, naming both and the fix."""
    measures = artifacts.read_json(path)
    runs = measures.get("runs") if isinstance(measures, dict) else None
    if not isinstance(runs, dict) or any(not isinstance(entry, dict) or not {"evaluation", "analysis"} <= set(entry)
                                         for entry in runs.values()):
        raise ValueError(f"{path} lacks runs with evaluation and analysis: it was not written by `istar measure`")
    differ = [f"{name} {measures.get(name)!r} where the analysis has {value!r}"
              for name, value in (expected or {}).items() if measures.get(name) != value]
    if differ:
        raise ValueError(f"{path} was measured with other settings than this analysis: {'; '.join(differ)}; measure "
                         "those runs again (in the workflow its measure job reruns once its spec is recorded: "
                         "`istar adopt-specs` for a results folder made before)")
    for entry in runs.values():
        entry["analysis"]["zeta"] = measures.get("zeta")
    return runs
