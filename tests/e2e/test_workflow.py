"""End-to-end tests of the Snakemake workflow: the paper's DAG, a tiny full run, incremental
reruns after a λ change, and the default demo."""

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_helpers import ENV, REPO, check_landing, clean_clone, planned_jobs, snakemake

PAPER_JOBS = {
    # Σ_S over real tokens (the measurements) and over every padded position (the runs: penalty.tokens)
    "prepare_data": 9, "shrinkage": 27, "shrinkage_all_positions": 27, "train_search": 648, "select": 27,
    # final base + CosReg: 27 × 2 × 5 seeds; Fig. 3 λ sweep: 27 × 7 λ × 5; Fig. 4 CosReg λ = −1 on QNLI: 3 × 5
    # (Figs. 5 and 6 reuse runs of the λ sweep; the final I-STAR runs, Figs. 7 and 8 and the padding
    # study wait for the selection)
    "train": 270 + 945 + 15,
    # one measure job per setting (every study uses the five final seeds): final 27 × 2, λ sweep 27 × 7,
    # Fig. 4's CosReg λ = −1 3 × 1 (Figs. 5 and 6 measure settings of the λ sweep and the base)
    "measure": 54 + 189 + 3,
    "stability": 1, "run_config": 1, "aggregate": 1, "experiment": 1, "all": 1,
}


def test_paper_config_dry_run_shows_the_full_study(tmp_path):
    # As on a machine with internet and an empty cache: building the DAG must not reach the hub.
    online = {**{k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}, "HF_HOME": str(tmp_path / "hf")}
    start = time.perf_counter()
    result = snakemake(tmp_path, "-n", configfile=REPO / "config" / "paper.yaml", env=online)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned_jobs(result.stdout)
    assert {rule: jobs.get(rule, 0) for rule in PAPER_JOBS} == PAPER_JOBS
    assert "checkpoint" in result.stdout  # the rest of the DAG appears once the selections exist
    print(f"paper.yaml dry run: {sum(jobs.values())} jobs planned in {seconds:.1f} s")


def test_confirmatory_paper_config_runs_no_search(tmp_path):
    """config/paper-confirmatory.yaml over paper.yaml: λ | ζ fixed to Table 2, so no search job, and every
    final I-STAR run is planned from the start at its fixed setting."""
    online = {**{k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}, "HF_HOME": str(tmp_path / "hf")}
    configs = [REPO / "config" / "paper.yaml", REPO / "config" / "paper-confirmatory.yaml"]
    result = snakemake(tmp_path, "-n", configfile=configs, env=online)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned_jobs(result.stdout)
    assert "train_search" not in jobs and jobs["select"] == 27
    assert "--fixed '{\"model\": \"bert\", \"task\": \"sst2\", \"lam\": -5.0, \"zeta\": 0.2" in result.stdout
    for run in ("bert/sst2/istar_lam-5_zeta0.2_allpos/seed4", "distilbert/cola/istar_lam-3_zeta0.4_allpos/seed0"):
        assert f"results/runs/{run}" in result.stdout
    # final: 27 cells × (Base, CosReg, I-STAR) × 5 seeds, all known before any job runs
    assert jobs["train"] >= 27 * 3 * 5 + 945


def test_anisotropy_config_dry_run_plans_the_model_by_checkpoint_grid(tmp_path):
    """config/anisotropy.yaml: Pythia's 8 sizes × 21 checkpoints and 5 more models, without reaching the hub."""
    online = {**{k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}, "HF_HOME": str(tmp_path / "hf")}
    result = snakemake(tmp_path, "-n", "surveys", configfile=REPO / "config" / "anisotropy.yaml", env=online)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == {"prepare_data": 1, "survey": 8 * 21 + 5, "survey_aggregate": 1,
                                           "figure": 6, "surveys": 1}
    config = yaml.safe_load((REPO / "config" / "anisotropy.yaml").read_text())
    pythia = {name: entry for name, entry in config["survey"]["models"].items() if name.startswith("pythia-")}
    assert sorted(entry["source"] for entry in pythia.values()) == sorted(
        f"EleutherAI/pythia-{size}" for size in ("70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b"))
    for entry in pythia.values():
        steps = [int(revision.removeprefix("step")) for revision in entry["revisions"]]
        assert steps[0] == 0 and steps[-1] == 143000 and len(steps) == 21 and steps == sorted(steps)
    assert "results/profile/pythia-12b/step143000.json" in result.stdout


def test_tiny_workflow_produces_every_output(tiny_project):
    results = tiny_project / "results"
    runs = pd.read_csv(results / "aggregate" / "runs.csv")
    assert set(runs["study"]) == {"search", "final", "lambda_sweep", "cosreg_means", "twonn", "layerwise",
                                  "zeta_sweep", "single_layer", "padding"}
    assert runs["score"].between(0, 1).all()
    analysed = runs[runs["study"] != "search"]
    assert analysed["isoscore_star"].between(0, 1).all() and analysed["cosine_similarity"].between(-1, 1).all()
    assert sorted(runs.loc[runs["study"] == "single_layer", "layer"].dropna().astype(int)) == [1, 2]
    best = json.loads((results / "selection" / "tiny" / "rte" / "best.json").read_text())
    assert best["lam"] in (-1.0, 1.0) and best["zeta"] == 0.2
    final = runs[runs["study"] == "final"]
    assert sorted(final["setting"]) == sorted(["base", "cosreg_lam1", f"istar_lam{best['lam']:g}_zeta0.2"])
    for run in final["run_dir"]:
        for name in ("metrics.json", "train_log.csv", "run_config.json", "model/config.json"):
            assert (tiny_project / run / name).is_file(), f"{run}/{name}"
        assert not (tiny_project / run / "resume").exists()
        measures = json.loads((results / "measures" / "tiny" / "rte" / Path(run).parent.name / "seeds0.json").read_text())
        evaluation = measures["runs"][run]["evaluation"]
        assert evaluation["metrics"]["accuracy"] == pytest.approx(final.loc[final["run_dir"] == run, "accuracy"].item(),
                                                                  abs=0.02)
    # one measurement per setting, shared by the studies; no activations file is kept per run
    measured = sorted(path.relative_to(results / "measures" / "tiny" / "rte")
                      for path in (results / "measures").rglob("*.json"))
    assert measured == sorted(Path(setting) / "seeds0.json" for setting in runs.loc[runs["study"] != "search", "setting"]
                              .unique())
    assert not list(results.rglob("activations*.safetensors"))
    layers = pd.read_csv(results / "aggregate" / "layers.csv")
    assert set(layers["hidden_state"]) == {0, 1, 2}
    for name in ("table1", "table2", "padding"):
        for ext in ("csv", "md", "tex"):
            assert (results / "tables" / f"{name}.{ext}").stat().st_size > 0
    epochs = pd.read_csv(results / "aggregate" / "epochs.csv")
    assert sorted(epochs["setting"].unique()) == sorted(final["setting"]) and set(epochs["epoch"]) == {0, 1, 2}
    assert epochs["sigma_s_isoscore"].between(0, 1).all()
    for figure in ("fig2", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "padding", "sigma_epochs"):
        for ext in ("png", "pdf"):
            assert (results / "figures" / f"{figure}.{ext}").stat().st_size > 1000
    report = (results / "report.html").read_text(errors="replace")
    assert "table1.csv" in report and "fig8.png" in report
    # where the code of every run and measurement came from, shown in the report
    assert "provenance.csv" in report
    provenance = pd.read_csv(results / "aggregate" / "provenance.csv")
    assert provenance["kind"].value_counts().to_dict() == {
        "run": runs["run_dir"].nunique(), "measurement": len(measured), "aggregate": 1}
    for run in final["run_dir"]:
        git = json.loads((tiny_project / run / "run_config.json").read_text())["provenance"]["git"]
        assert len(git["commit"]) == 40  # the istar package's checkout, even though the workflow runs elsewhere
    # search model folders are temporary; final ones are kept
    assert not list((results / "search").glob("*/*/*/seed*/model"))
    assert planned_jobs(snakemake(tiny_project, "-n").stdout) == {}


def test_tiny_landing_page_names_its_search_cosreg_and_every_study_with_the_padding_study(tiny_project):
    md = check_landing(tiny_project / "results", search="validation", cosreg=True, studies={
        "lambda_sweep", "cosreg_means", "twonn", "layerwise", "zeta_sweep", "single_layer", "padding"})
    assert "Real-token IsoScore* against performance" in md  # the padding study, by its figure's caption


def test_changing_one_lambda_reruns_only_what_depends_on_it(tiny_project, tmp_path):
    config = yaml.safe_load((tiny_project / "config.yaml").read_text())
    config["studies"]["lambda_sweep"]["lambdas"] = [-1, 3]
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    result = snakemake(tiny_project, "-n", configfile=changed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == {
        "train": 1, "measure": 1, "aggregate": 1, "experiment": 1, "table": 5, "figure": 9, "summary": 1,
        "run_config": 1, "report": 1, "all": 1}
    assert "results/runs/tiny/rte/istar_lam3_zeta0.2/seed0/metrics.json" in result.stdout
    # and really run them: the inputs the finished jobs left (prepared data, Σ_S, pins) pass the
    # integrity check that runs before any job starts
    rerun = snakemake(tiny_project, "--cores", "2", configfile=changed)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert planned_jobs(snakemake(tiny_project, "-n", configfile=changed).stdout) == {}


def test_padding_study_compares_the_token_selections_at_the_selected_setting(tiny_project):
    results = tiny_project / "results"
    best = json.loads((results / "selection" / "tiny" / "rte" / "best.json").read_text())
    runs = pd.read_csv(results / "aggregate" / "runs.csv")
    padding = runs[runs["study"] == "padding"]
    istar = f"istar_lam{best['lam']:g}_zeta0.2"
    assert sorted(zip(padding["setting"], padding["tokens"])) == [
        ("base", "real"), (istar, "real"), (f"{istar}_allpos", "all_positions")]
    assert padding["isoscore_star"].between(0, 1).all()
    allpos = tiny_project / padding.loc[padding["tokens"] == "all_positions", "run_dir"].item()
    assert json.loads((allpos / "run_config.json").read_text())["tokens"] == "all_positions"
    assert json.loads((allpos / "run_config.json").read_text())["sigma_s"].endswith("sigma0_allpos.pt")
    assert set(pd.read_csv(allpos / "train_log.csv")["penalty_tokens"]) == {"all_positions"}
    sigma = json.loads((tiny_project / "resources" / "shrinkage" / "tiny" / "rte" / "sigma0_allpos.json").read_text())
    assert sigma["tokens"] == "all_positions" and sigma["batch_size"] == 16  # the training batch size
    table = (results / "tables" / "padding.md").read_text()
    assert "I-STAR, all positions" in table and "I-STAR, real tokens" in table and "RTE IsoScore" in table


def test_changing_the_token_selection_reruns_exactly_the_penalised_runs(tiny_project, tmp_path):
    """penalty.tokens: all_positions renames every CosReg and I-STAR setting (…_allpos): the search reruns
    and so does the selection; the data, both Σ_S files, the baseline and the padding study's runs (which
    name their token selection themselves) stay. Before the new selection exists the plan holds the
    runs that do not depend on it: CosReg λ = ±1 (final and Fig. 4) and the λ sweep's I-STAR runs,
    but not the one the padding study already trained on all positions."""
    best = json.loads((tiny_project / "results" / "selection" / "tiny" / "rte" / "best.json").read_text())
    config = yaml.safe_load((tiny_project / "config.yaml").read_text())
    config.setdefault("penalty", {})["tokens"] = "all_positions"
    changed = tmp_path / "tokens.yaml"
    changed.write_text(yaml.safe_dump(config))
    result = snakemake(tiny_project, "-n", configfile=changed)
    assert result.returncode == 0, result.stderr[-3000:]
    planned = {line.split("results/runs/tiny/rte/")[1].split("/")[0] for line in result.stdout.splitlines()
               if line.strip().startswith("output:") and "results/runs/tiny/rte/" in line}
    assert planned == {"cosreg_lam1_allpos", "cosreg_lam-1_allpos"} | {
        f"istar_lam{lam:g}_zeta0.2_allpos" for lam in (-1, 1) if lam != best["lam"]}
    assert planned_jobs(result.stdout) == {
        "train_search": 2, "select": 1, "train": 3, "measure": 3, "aggregate": 1, "experiment": 1, "table": 5,
        "figure": 9, "summary": 1, "run_config": 1, "report": 1, "all": 1}


def run_in_clone(clone: Path, *args: str, timeout: int = 1800):
    """The README's command in a clean clone: its own Snakefile and default config, offline."""
    return snakemake(clone, *args, configfile=clone / "config" / "config.yaml", snakefile=clone / "workflow" / "Snakefile",
                     timeout=timeout)


def test_default_demo_config_runs_to_the_report(tmp_path):
    """The README's command in a clean clone, offline: planned, then run to the report on the demo data."""
    clone = clean_clone(tmp_path / "alone")
    dry = run_in_clone(clone, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert planned_jobs(dry.stdout)["train"] > 0
    start = time.perf_counter()
    result = run_in_clone(clone, "--cores", "2")
    minutes = (time.perf_counter() - start) / 60
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    print(f"default demo: {minutes:.1f} min")
    meta = json.loads((clone / "resources" / "data" / "rte" / "meta.json").read_text())
    assert meta["source"] == "mirror" and meta["rows"] == {"train": 64, "validation": 64}
    assert (clone / "resources" / "shrinkage" / "minilm" / "rte" / "sigma0.pt").is_file()
    results = clone / "results"
    assert len(pd.read_csv(results / "aggregate" / "runs.csv")) > 0
    assert (results / "report.html").is_file()
    for figure in ("fig2", "fig3", "fig4", "fig5", "fig6"):
        assert (results / "figures" / f"{figure}.png").is_file()
    assert not (results / "figures" / "fig7.png").exists()  # its study is off in the demo
    # the report opens on the demo's own landing page: its validation-split search (and the bias that implies),
    # CosReg, and the four figure studies it runs
    check_landing(results, search="validation", cosreg=True, studies={"lambda_sweep", "cosreg_means", "twonn", "layerwise"})
