"""What the parts of one test module split by lane share (helpers and fixtures):
tests/fast/steps/test_reliability_faults.py, tests/integration/test_reliability_faults.py."""

import os
import subprocess

import pytest


# --------------------------------------------------------------------------------------- resources


def _mount(*args):
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system for a real full disk needs root")
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(mebibytes) -> a folder on a tmpfs of that size; resize(mebibytes) grows it."""
    mounted = []

    def make(mebibytes):
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        _mount("-t", "tmpfs", "-o", f"size={mebibytes}M", "tmpfs", str(folder))
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)
