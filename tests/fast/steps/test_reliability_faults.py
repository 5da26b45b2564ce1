"""Faults a cluster and a shared disk deliver (issue 24): signals, one writer per run folder,
full disks, read-only outputs and damaged resume states, each on a real tiny run.

Full disks are real: a small tmpfs mounted for the test (root only; skipped otherwise).
Read-only folders are a read-only bind mount as root (``chmod`` does not stop root), a
``chmod 0555`` folder otherwise.
"""

import pytest
from reliability_faults_helpers import small_disk

from istar.io import artifacts


def test_an_atomic_write_on_a_full_disk_keeps_the_previous_file(small_disk):
    disk = small_disk(1)
    artifacts.write_json(disk / "measures.json", {"runs": {}}, digest=True)
    with pytest.raises(artifacts.OutOfSpaceError) as error:
        artifacts.write_json(disk / "measures.json", {"runs": {"x": "y" * (2 << 20)}}, digest=True)
    assert f"no space left on the disk of {disk / 'measures.json'}" in str(error.value)
    assert "the previous measures.json is kept unchanged" in str(error.value)
    assert artifacts.read_json(disk / "measures.json")["runs"] == {}
    assert [p.name for p in disk.iterdir()] == ["measures.json"]
