"""The package as users on a cluster install it: a wheel, used from a folder with no checkout around it."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from mirrors import REPO


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


# python -m build (an sdist, then the wheel from it), twine check, a fresh venv: about 1 min
def test_the_release_builds_passes_twine_and_installs_in_a_fresh_venv(tmp_path):
    """The release as docs/release.md makes it: ``python -m build`` writes the sdist and the wheel built from that
    sdist (so the sdist is complete), ``twine check`` passes both, and the wheel installs into a new virtual
    environment outside the repository, where ``istar --version``, the metadata and the library face come from it.

    The new environment gets the wheel alone (``pip install --no-deps --no-index``); its dependencies (torch,
    transformers, …, gigabytes) are this environment's, reached through a path file added after the install, so
    that nothing is downloaded and every import is checked to come from the installed wheel, not the checkout.
    """
    import sysconfig

    import istar

    source = tmp_path / "source"
    shutil.copytree(REPO / "istar", source / "istar", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob(f"istar-{istar.__version__}.tar.gz")
    (wheel,) = (tmp_path / "dist").glob(f"istar-{istar.__version__}-py3-none-any.whl")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    venv = tmp_path / "fresh"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    code = ("import importlib.metadata, importlib.resources, istar\n"
            "print(istar.__file__)\n"
            "print(importlib.metadata.version('istar'))\n"
            "print(importlib.resources.files('istar.config').joinpath('config.schema.yaml').is_file())\n"
            "print(istar.IStarConfig(lam=-1.0).zeta, istar.IStarModel.__module__)\n")
    ran = subprocess.run([str(python), "-c", code], cwd=away, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, version, schema, config = ran.stdout.strip().splitlines()
    assert Path(where).is_relative_to(venv), f"istar came from {where}, not the fresh venv"
    assert (version, schema, config) == (istar.__version__, "True", "0.2 istar.integrations.wrapper")
    command = subprocess.run([str(venv / "bin" / "istar"), "--version"], cwd=away, env=env, capture_output=True,
                             text=True, timeout=300)
    assert command.returncode == 0 and command.stdout.strip() == f"istar {istar.__version__}", command.stderr
