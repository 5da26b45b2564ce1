"""istar's cache (the remembered architecture verdicts, istar.models.loading.cache_dir) in a folder of the
test session's, not the user's, as a pytest plugin (tests/conftest.py loads it): made before the
pytest-xdist workers and every subprocess inherit it, removed at the end."""

import os
import shutil
import tempfile

import pytest

SESSION_CACHE = pytest.StashKey[str]()  # the istar cache folder this session made


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["ISTAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="istar-test-cache-")
        config.stash[SESSION_CACHE] = os.environ["ISTAR_CACHE_DIR"]


def pytest_unconfigure(config):
    if SESSION_CACHE in config.stash:
        shutil.rmtree(config.stash[SESSION_CACHE], ignore_errors=True)
