"""Integrity of artifacts: damaged files are named, with the command that rebuilds them (issue 11, case 3).

Each test damages a real artifact written by the project's own writer: truncation (a new
timestamp) and a flipped byte with the old timestamp restored (invisible to Snakemake).
"""

import os
import pickle
import shutil
import stat

import pytest
import torch

from istar.core.covariance import CovarianceAccumulator
from istar.io import artifacts
from istar.io.artifacts import DamagedArtifactError


def flip_byte(path, offset_from_end=64):
    """Change one byte near the end of ``path``, keeping its modification time."""
    times = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def accumulators(layers=3, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    result = []
    for _ in range(layers):
        accumulator = CovarianceAccumulator(dim)
        accumulator.add(torch.randn(50, dim, generator=generator))
        result.append(accumulator)
    return result


@pytest.fixture
def sigma_file(tmp_path):
    from istar.core.shrinkage import save_shrinkage

    path = tmp_path / "sigma0.pt"
    save_shrinkage(path, accumulators(), [1, 2], {"model": "tiny", "task": "rte"})
    return path


def test_sigma_round_trip_without_pickle(sigma_file):
    from istar.core.shrinkage import load_layer_statistics, load_shrinkage, merge_layers

    sigma, provenance = load_shrinkage(sigma_file)
    expected = merge_layers(accumulators(), [1, 2]).covariance()
    torch.testing.assert_close(sigma, expected, rtol=0, atol=0)
    assert provenance["layers"] == [1, 2] and provenance["rows"] == 100 and provenance["task"] == "rte"
    per_layer, _ = load_layer_statistics(sigma_file)
    assert [a.count for a in per_layer] == [50, 50, 50]
    with pytest.raises(pickle.UnpicklingError):  # safetensors, not a pickle
        pickle.loads(sigma_file.read_bytes())


@pytest.mark.parametrize("damage", [truncate, flip_byte, lambda p: p.write_bytes(b"garbage" * 10)],
                         ids=["truncated", "flipped-byte-same-mtime", "garbage"])
def test_damaged_sigma_names_the_file(sigma_file, damage):
    from istar.core.shrinkage import load_shrinkage

    damage(sigma_file)
    with pytest.raises(DamagedArtifactError) as error:
        load_shrinkage(sigma_file)
    message = str(error.value)
    assert f"{sigma_file} is damaged" in message and f"snakemake --forcerun {sigma_file}" in message
    assert "weights_only" not in message and "\n" not in message


def test_pickled_sigma_is_refused_without_unpickling(tmp_path):
    """An old-format or hostile pickle is never unpickled (no code runs)."""
    from istar.core.shrinkage import load_shrinkage

    path = tmp_path / "sigma0.pt"
    torch.save({"per_layer": {"count": torch.tensor([1])}, "provenance": {}}, path)
    with pytest.raises(DamagedArtifactError, match="not a readable safetensors file"):
        load_shrinkage(path)


def test_tensor_file_damage_is_named_and_mode_is_normal(tmp_path):
    from istar.io.artifacts import load_tensors

    path = tmp_path / "tensors.safetensors"
    old = os.umask(0o022)
    try:
        artifacts.save_tensors(path, {"cls.layer0": torch.randn(4, 3)}, {"model": "tiny"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    tensors, metadata = load_tensors(path)
    assert metadata["model"] == "tiny" and tensors["cls.layer0"].shape == (4, 3)
    flip_byte(path, offset_from_end=8)
    with pytest.raises(DamagedArtifactError, match=f"{path} is damaged"):
        load_tensors(path)


def test_every_atomic_write_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        artifacts.write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640


@pytest.mark.parametrize("damage", [truncate, flip_byte], ids=["truncated", "flipped-byte-same-mtime"])
def test_damaged_parquet_names_the_file(prepared, tmp_path, damage):
    from istar.data import read_split

    folder = tmp_path / "rte"
    shutil.copytree(prepared("rte", 48, 24), folder)
    damage(folder / "train.parquet")
    with pytest.raises(DamagedArtifactError) as error:
        read_split(folder, "train")
    assert f"{folder / 'train.parquet'} is damaged" in str(error.value)
    assert len(read_split(folder, "validation")) == 24  # the other split is untouched and still reads


def test_an_intact_prepared_folder_passes_the_check_before_jobs_start(prepared):
    # what the workflow's onstart runs on every existing input: meta.json's split hashes must not
    # be mistaken for a hash of meta.json itself
    folder = prepared("rte", 48, 24)
    for name in ("meta.json", "train.parquet", "validation.parquet"):
        artifacts.verify_artifact(folder / name)


def test_the_check_of_meta_json_covers_the_splits_it_lists(prepared, tmp_path):
    # the rules take a prepared folder through its meta.json alone, so the check before jobs start
    # reaches the splits through it
    folder = tmp_path / "rte"
    shutil.copytree(prepared("rte", 48, 24), folder)  # (a copy: the fixture's folder is shared)
    flip_byte(folder / "validation.parquet")
    with pytest.raises(DamagedArtifactError) as error:
        artifacts.verify_artifact(folder / "meta.json")
    assert f"{folder / 'validation.parquet'} is damaged" in str(error.value)
    assert f"--forcerun {folder / 'validation.parquet'}" in str(error.value)


def test_damaged_model_folder_names_the_file(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    digests = artifacts.record_digests(folder)
    assert "model.safetensors" in digests and "config.json" in digests
    artifacts.verify_digests(folder)
    flip_byte(folder / "model.safetensors", offset_from_end=100)
    with pytest.raises(DamagedArtifactError) as error:
        artifacts.verify_digests(folder)
    assert f"{folder / 'model.safetensors'} is damaged" in str(error.value)
    assert f"snakemake --forcerun {folder}" in str(error.value)


def test_json_result_content_is_checked(tmp_path):
    path = tmp_path / "result.json"
    artifacts.write_json(path, {"global": {"isoscore_star": 0.25}, "layers": []}, digest=True)
    assert artifacts.read_json(path)["global"]["isoscore_star"] == 0.25
    path.write_text(path.read_text().replace("0.25", "0.75"))
    with pytest.raises(DamagedArtifactError, match="differs from the sha256"):
        artifacts.read_json(path)
    path.write_text('{"global": {"isoscore')
    with pytest.raises(DamagedArtifactError, match="not valid JSON"):
        artifacts.read_json(path)


def test_measurement_file_content_is_checked(tmp_path):
    from istar.io.results import read_measures

    path = tmp_path / "measures.json"
    entry = {"evaluation": None, "analysis": {"global": {"isoscore_star": 0.25}, "layers": [], "last_layer": {}}}
    artifacts.write_json(path, {"runs": {"results/runs/m/rte/base/seed0": entry}}, digest=True)
    assert read_measures(path)["results/runs/m/rte/base/seed0"] == {**entry, "analysis": {**entry["analysis"], "zeta": None}}
    path.write_text(path.read_text().replace("0.25", "0.75"))
    with pytest.raises(DamagedArtifactError, match="differs from the sha256"):
        read_measures(path)
    artifacts.write_json(path, {"global": {"isoscore_star": 0.25}}, digest=True)  # a digested JSON, not a measurement
    with pytest.raises(ValueError, match="not written by `istar measure`"):
        read_measures(path)


def test_a_measurement_of_another_analysis_is_refused_by_its_reader(tmp_path):
    """A measurement made with another ζ or Σ_S reference than the analysis asks for gives no number: the aggregate
    refuses it, naming the file, both values and the fix (a stale file after an edit of analysis.zeta)."""
    from istar.io.results import read_measures

    path = tmp_path / "measures.json"
    entry = {"evaluation": None, "analysis": {"global": {"isoscore_star": 0.25}, "layers": [], "last_layer": {}}}
    artifacts.write_json(path, {"zeta": 0.2, "sigma_s_model": "pretrained", "runs": {"run": entry}}, digest=True)
    assert read_measures(path, {"zeta": 0.2, "sigma_s_model": "pretrained"})["run"]["analysis"]["zeta"] == 0.2
    with pytest.raises(ValueError, match=r"measures.json was measured with other settings than this analysis: "
                                         r"zeta 0.2 where the analysis has 0.6; measure those runs again"):
        read_measures(path, {"zeta": 0.6, "sigma_s_model": "pretrained"})
    with pytest.raises(ValueError, match="sigma_s_model 'pretrained' where the analysis has 'fine_tuned'"):
        read_measures(path, {"zeta": 0.2, "sigma_s_model": "fine_tuned"})


def test_a_killed_step_is_explained_and_exits_128_plus_the_signal(capsys):
    from istar.steps.launch import exit_status

    assert exit_status(0, "train") == 0 and exit_status(3, "train") == 3
    assert exit_status(-9, "train") == 137  # not Python's 256 - 9 = 247
    message = capsys.readouterr().err
    assert "`istar train` was killed by SIGKILL" in message and "resumes from the last state" in message
