"""The GPU check (bench/gpu_check.py) in its reduced CPU form, end to end, and the GPU study
config (config/gpu-study.yaml) as a Snakemake dry run."""

import yaml
from mirrors import REPO


GPU_STUDY_JOBS = {
    # per task (SST-2, MRPC): λ | ζ fixed in advance, so no search; Σ_S over real tokens (for the
    # measurements) and over all positions (the penalty's); Base and I-STAR over 10 seeds, one
    # measure job per setting
    "prepare_data": 2, "pin_model": 1, "shrinkage": 2, "shrinkage_all_positions": 2, "select": 2,
    "train": 2 * 2 * 10, "measure": 2 * 2,
    "run_config": 1, "aggregate": 1, "experiment": 1, "table": 4, "figure": 2, "summary": 1, "report": 1, "all": 1,  # Tables 1, 2, claims, seeds; Σ_S across epochs, the forest plot
}


def test_gpu_study_config_dry_run(tmp_path):
    from mirrors import TEST_DATA
    from workflow_helpers import planned_jobs, snakemake

    config = yaml.safe_load((REPO / "config" / "gpu-study.yaml").read_text())
    assert config["training"]["gpus"] == 1 and config["training"]["mixed_precision"] == "fp16"
    config["data"].update(source="mirror", mirror=str(TEST_DATA), subset=True)  # offline: a dry run only asks that the files exist
    configfile = tmp_path / "gpu-study.yaml"
    configfile.write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n", "--resources", "gpu=1", configfile=configfile)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == GPU_STUDY_JOBS
    # every fine-tune is launched on one GPU in fp16
    launched = [line for line in result.stdout.splitlines() if "--gpus 1 -- train --spec" in line]
    assert len(launched) == 40 and all('"mixed_precision": "fp16"' in line for line in launched)
