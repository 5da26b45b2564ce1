"""The package as users on a cluster install it: a wheel, used from a folder with no checkout around it."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory):
    """The wheel `pip wheel --no-deps .` builds, unpacked into a folder outside the repository.

    It is built from a copy of what the build reads, so the checkout gets no build/ folder.
    """
    source, build = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO / "istar", source / "istar", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(build), str(source)], check=True, capture_output=True, text=True)
    (wheel,) = build.glob("istar-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "istar/config/config.schema.yaml" in names, "the schema is not in the wheel"
    return site


def _istar(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "istar", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.integration
def test_the_wheel_validates_a_config_and_offers_every_step(unpacked_wheel, tmp_path):
    where = subprocess.run([sys.executable, "-c", "import istar; print(istar.__file__)"], cwd=tmp_path, text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(unpacked_wheel)}, check=True)
    assert Path(where.stdout.strip()).is_relative_to(unpacked_wheel), "the test did not import the wheel's istar"
    (tmp_path / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    checked = _istar(unpacked_wheel, tmp_path, "config", "--no-path-checks", "config.yaml")
    assert checked.returncode == 0, checked.stderr
    assert "learning_rate:" in checked.stdout and "zeta: 0.2" in checked.stdout
    for step in ("train", "shrinkage", "measure", "prepare-data"):
        helped = _istar(unpacked_wheel, tmp_path, step, "--help")
        assert helped.returncode == 0, helped.stderr
        assert "--spec" in helped.stdout
