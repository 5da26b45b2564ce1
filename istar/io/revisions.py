"""Hugging Face hub revisions: a branch, tag or commit of a model or dataset repo, pinned to its commit.

A revision is resolved to its 40-hex commit once (``pin-model`` for models, ``prepare-data`` for
datasets), the commit is recorded (``resources/models/{model}.json``, ``meta.json``), and every
later load asks for that commit, so a run is reproducible even when the branch moves.

Resolution asks the hub (``HF_ENDPOINT``) and, when it cannot be reached or ``HF_HUB_OFFLINE``
is set, the local cache's record of the ref (``$HF_HUB_CACHE/<repo folder>/refs/<revision>``,
written by every earlier download). Only the standard ``huggingface_hub`` client is used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["COMMIT", "DEFAULT_REVISION", "RevisionUnavailableError", "resolve_revision", "cached_commit", "offline"]

COMMIT = re.compile(r"[0-9a-f]{40}")
"""A full commit hash: the only revision form that cannot move."""

DEFAULT_REVISION = "main"

OFFLINE_FIX = {
    "model": "fix: run once with internet (HF_HUB_OFFLINE unset) so the hub cache holds it, "
             "or point the source at a local folder with config.json or a package:NAME/SUBFOLDER",
    "dataset": "fix: run once with internet (HF_HUB_OFFLINE unset) so the hub cache holds it",
}
"""The remedy named in the one-line error, per repo type."""


class RevisionUnavailableError(RuntimeError):
    """A hub revision cannot be resolved: the hub is unreachable and the cache does not hold it."""


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids asking the hub (the values huggingface_hub accepts as true)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def cached_commit(repo_id: str, revision: str, repo_type: str = "model") -> str | None:
    """The commit of ``revision`` of a repo when the local hub cache holds files of it, else None."""
    folder = _cache_folder(repo_id, repo_type)
    commit = revision
    if not COMMIT.fullmatch(revision):
        ref = folder / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else ""
    return commit if COMMIT.fullmatch(commit) and (folder / "snapshots" / commit).is_dir() else None


def _cache_folder(repo_id: str, repo_type: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"


def resolve_revision(repo_id: str, revision: str | None = None, repo_type: str = "model") -> str:
    """The 40-hex commit of ``revision`` (a branch, tag or commit; None = ``main``) of a hub repo.

    A full commit is returned as it is. Otherwise the hub is asked (and the answer recorded in
    the cache); when it cannot be reached (or ``HF_HUB_OFFLINE`` is set) the cache's ref is used. Raises
    :class:`RevisionUnavailableError` with one line naming the repo, the revision and the fix
    when neither knows it, and ``ValueError`` when the hub answers that it does not exist.
    """
    revision = revision or DEFAULT_REVISION
    if COMMIT.fullmatch(revision):
        return revision
    what = f"{repo_type} {repo_id!r} at revision {revision!r}"
    reason = "HF_HUB_OFFLINE is set"
    if not offline():
        from huggingface_hub import HfApi
        from huggingface_hub.utils import RepositoryNotFoundError, RevisionNotFoundError

        try:
            commit = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision).sha
        except RevisionNotFoundError:
            raise ValueError(f"{what}: the hub has no such branch, tag or commit") from None
        except RepositoryNotFoundError:
            # (servers that mirror the hub answer this for an unknown revision too)
            raise ValueError(f"{what}: the hub has no such repository or revision (or it needs a login)") from None
        except Exception as error:  # connection refused, DNS, timeouts: all mean "not reachable"
            reason = f"the hub is not reachable ({type(error).__name__})"
        else:
            # recorded in the cache as huggingface_hub does when it downloads by branch: loads go by commit,
            # which leaves no ref behind, and this record lets a later offline run resolve the same revision
            ref = _cache_folder(repo_id, repo_type) / "refs" / revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)
            return commit
    commit = cached_commit(repo_id, revision, repo_type)
    if commit is None:
        raise RevisionUnavailableError(f"{what} is not in the local Hugging Face cache and {reason}; {OFFLINE_FIX[repo_type]}")
    return commit
