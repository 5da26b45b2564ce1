"""Tests of istar.data: mirror and hub loaders, stand-ins, subsampling, prepared folders, CLI."""

import os
import shutil
import subprocess
import sys

import pytest
from data_helpers import break_file, tiny_mirror
from mirrors import FULL_MIRROR, REPO, TEST_DATA

from istar.data import load_task, read_meta, read_split


def test_test_data_matches_its_sums_and_readme(tmp_path):
    check = [sys.executable, str(REPO / "scripts" / "test-data"), "--check"]
    result = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    damaged = tmp_path / "data"
    shutil.copytree(TEST_DATA, damaged)
    break_file(damaged, "glue/RTE/dev.tsv", lambda text: text.replace("entailment", "entailment ", 1))
    result = subprocess.run([*check, "--out", str(damaged)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "glue/RTE/dev.tsv does not match its sha256 in SHA256SUMS" in result.stdout


@pytest.mark.full_release
def test_test_data_is_the_slice_the_script_makes_of_the_releases(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "test-data"), "--release", str(FULL_MIRROR),
                             "--out", str(tmp_path / "slice")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    built = sorted(str(p.relative_to(tmp_path / "slice")) for p in (tmp_path / "slice").rglob("*") if p.is_file())
    shipped = sorted(str(p.relative_to(TEST_DATA)) for p in TEST_DATA.rglob("*") if p.is_file())
    assert built == shipped
    assert [name for name in built if (tmp_path / "slice" / name).read_bytes() != (TEST_DATA / name).read_bytes()] == []


def test_a_skipped_test_fails_the_run_and_the_last_lines_say_why(tmp_path):
    """The conftest's rule, on a real session: the full-release row of one test with no release copy."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "full_release",
                             "tests/fast/data/test_data.py::test_mirror_values_are_parsed_verbatim"], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "ISTAR_FULL_MIRROR": str(tmp_path / "no-release")})
    assert result.returncode == 1, result.stdout[-3000:]
    last = result.stdout.splitlines()[-3:]
    assert "1 skipped: this run FAILS" in last[0]
    assert last[1] == ("SKIPPED tests/fast/data/test_data.py::test_mirror_values_are_parsed_verbatim[full-release]: the "
                       f"full_release group needs a full copy of the releases at {tmp_path / 'no-release'} (set "
                       "$ISTAR_FULL_MIRROR to one); `make test` leaves the group out")
    assert "1 skipped, 1 deselected" in last[2]


def test_auto_uses_env_mirror_else_hub(tiny_mirror, hub, tmp_path, monkeypatch):
    """auto: the mirror named by $ISTAR_DATA_MIRROR; with none named, the hub (the test server)."""
    monkeypatch.setenv("ISTAR_DATA_MIRROR", str(tiny_mirror))
    splits, provenance = load_task("qnli", subset=True)
    assert provenance["source"] == "mirror" and provenance["source_requested"] == "auto"
    assert provenance["mirror"] == str(tiny_mirror.resolve())
    monkeypatch.delenv("ISTAR_DATA_MIRROR")

    def prepare(out, **env):  # a new process, as a workflow job: the hub clients read their environment at import
        return subprocess.run([sys.executable, "-m", "istar", "prepare-data", "--task", "qnli", "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **hub.env(tmp_path / "hf"), **env})

    result = prepare(tmp_path / "from-hub")
    assert result.returncode == 0, result.stderr[-2000:]
    meta = read_meta(tmp_path / "from-hub")
    assert meta["source"] == "hub" and meta["hub_commit"] == hub.dataset_commits["nyu-mll/glue"]
    result = prepare(tmp_path / "unreachable", HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "empty"))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("error: dataset 'nyu-mll/glue' at revision 'main' is not in the local Hugging Face "
                                    "cache and the hub is not reachable"), result.stderr[-2000:]
    assert "use source 'mirror' with a path" in result.stderr


# ------------------------------------------------------------------ command line


def test_module_cli_runs_as_a_subprocess(tmp_path):
    out = tmp_path / "rte"
    result = subprocess.run(
        [sys.executable, "-m", "istar", "prepare-data", "--task", "rte", "--out", str(out),
         "--mirror", str(TEST_DATA), "--subset", "--max-train-samples", "50"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert "rte train: 50 rows (of 500)" in result.stdout
    assert "rte validation: 100 rows (of 100)" in result.stdout
    assert read_meta(out)["rows"] == {"train": 50, "validation": 100}
    assert len(read_split(out, "train")) == 50
