"""Where a result's code came from: the workflow's git commit, uncommitted changes, package versions.

Every run (``run_config.json``), measurement file and the report record :func:`code_provenance`::

    {"git": {"commit": "…40 hex…", "dirty": true, "diff_sha256": "…", "root": "/path/to/checkout"},
     "versions": {"istar": "0.1.0", "torch": "2.13.0", "transformers": …, "accelerate": …, "python": "3.11.7"},
     "code_sha256": "…"}

The checkout is the one holding the imported ``istar`` package (the code that ran: the
workflow's own checkout, or an editable install of it); when the package lies outside any
checkout, the one holding the working directory (Snakemake runs every job from the workflow's root). ``dirty`` is true when tracked files differ from the commit or untracked,
non-ignored files exist; ``diff_sha256`` hashes those changes (``git diff HEAD --binary`` and
the untracked files' names and contents), so two results with the same commit and hash ran
the same code. Outside a git checkout (or without git) ``git`` is
``{"commit": null, "note": "not a git checkout: …"}``, naming both places looked at.

``diff_sha256`` changes with any file of the checkout, a growing log beside the code included;
``code_sha256`` (:func:`package_sha256`) hashes the imported package's own files alone, so two
results with one ``code_sha256`` ran the same code, installed or from a checkout.

Provenance is not part of a run's fingerprint (:mod:`istar.steps.resume`): a new commit must not
invalidate finished runs or resume states.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

__all__ = ["code_provenance", "git_provenance", "package_versions", "package_sha256", "portable_path", "KEY_PACKAGES"]

# The installed packages whose versions can change a result (besides istar itself).
KEY_PACKAGES = ("torch", "transformers", "accelerate", "numpy", "scipy", "tokenizers", "safetensors")


def _git(root: Path, *args: str, binary: bool = False):
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True, timeout=60)
    return result.stdout if binary else result.stdout.decode().strip()


def git_provenance(where: Path | str | None = None) -> dict:
    """The commit of the git checkout holding ``where`` (default: the working directory), and its changes."""
    where = Path.cwd() if where is None else Path(where)
    try:
        root = Path(_git(where, "rev-parse", "--show-toplevel"))
        commit = _git(root, "rev-parse", "HEAD")
    except FileNotFoundError:
        return {"commit": None, "note": "git is not installed: the code version is unknown"}
    except subprocess.CalledProcessError as error:
        reason = (error.stderr or b"").decode().strip().splitlines()
        return {"commit": None, "note": f"not a git checkout: {where} ({reason[0] if reason else 'git failed'})"}
    diff = _git(root, "diff", "HEAD", "--binary", binary=True)
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", binary=True).decode().split("\0")
    digest = hashlib.sha256(diff)
    for name in sorted(n for n in untracked if n):
        path = root / name
        digest.update(name.encode() + b"\0")
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    dirty = bool(diff) or any(untracked)
    return {"commit": commit, "dirty": dirty, "diff_sha256": digest.hexdigest() if dirty else None, "root": str(root)}


def package_versions() -> dict:
    """The imported istar's ``__version__`` (the code that ran, installed or not), the installed version of
    each of :data:`KEY_PACKAGES` (None where one is not installed) and Python's."""
    from istar import __version__

    versions = {"istar": __version__}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


def package_sha256(package: Path | None = None) -> str:
    """SHA-256 over the ``istar`` package's files (default: the imported one): each file's path relative
    to the package and its bytes, in sorted order; compiled bytecode (``__pycache__``) left out."""
    package = Path(__file__).resolve().parents[1] if package is None else Path(package)
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@lru_cache(maxsize=4)
def _provenance(cwd: str) -> dict:
    package = Path(__file__).resolve().parents[1]
    git = git_provenance(package)
    if git["commit"] is None:
        git = git_provenance(cwd)
        if git["commit"] is None:
            git["note"] = f"not a git checkout: neither the istar package ({package}) nor the working directory ({cwd})"
    return {"git": git, "versions": package_versions(), "code_sha256": package_sha256(package)}


def code_provenance() -> dict:
    """:func:`git_provenance` of the code's checkout and :func:`package_versions` (once per process and directory)."""
    return json.loads(json.dumps(_provenance(str(Path.cwd()))))  # a copy: callers may extend it


def portable_path(path: str) -> str:
    """``path`` as a record keeps it: relative to the working directory when it lies inside it (a project's
    own folders then read the same in every clone of the project), else as it is (a hub id, a package's folder)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(Path.cwd())) if Path(path).exists() and resolved.is_relative_to(Path.cwd()) else path
