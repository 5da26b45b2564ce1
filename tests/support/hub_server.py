"""A Hugging Face-compatible hub on 127.0.0.1 for the tests: olah serving git repos the tests build.

``olah`` (the ``dev`` extra) is a self-hosted hub mirror. In its offline local-mirror mode it
serves every git repository under ``<mirrors>/{models|datasets}/<org>/<repo>`` with the hub's
HTTP API (repo info, revisions, file resolution), never contacting an upstream: its upstream
address is a closed port. The same ``huggingface_hub``, ``datasets`` and ``transformers`` code a
user runs against huggingface.co then runs against it, with ``HF_ENDPOINT`` pointing here.

    server = HubServer(tmp_path)
    commits = server.add_repo("models", "org/name", {"main": {"config.json": b"{}"}, "v2": {...}})
    server.start()            # waits until the API answers; server.env() -> HF_ENDPOINT, HF_HOME
    ...
    server.stop()

Repos may have several branches (each a dict relative path -> bytes or a file to copy); the
commit of each branch is returned, so tests can pin by commit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["HubServer", "olah_command"]

_GIT_ENV = {"GIT_AUTHOR_NAME": "istar tests", "GIT_AUTHOR_EMAIL": "tests@localhost",
            "GIT_COMMITTER_NAME": "istar tests", "GIT_COMMITTER_EMAIL": "tests@localhost",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def olah_command() -> str | None:
    """The ``olah-cli`` executable beside this interpreter (or on PATH), or None when not installed."""
    beside = Path(sys.executable).parent / "olah-cli"
    return str(beside) if beside.is_file() else shutil.which("olah-cli")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, env={**os.environ, **_GIT_ENV},
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


class HubServer:
    """An olah process serving the git repos under ``root/mirrors`` (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.mirrors = self.root / "mirrors"
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.started_in: float | None = None

    def add_repo(self, kind: str, repo_id: str, branches: dict[str, dict[str, bytes | Path]]) -> dict[str, str]:
        """Create (or extend) the git repo ``repo_id`` of ``kind`` ("models" or "datasets").

        ``branches`` maps a branch name to its files (relative path -> bytes, or a Path to copy);
        the first branch given starts from an empty tree, later ones from ``main``. Returns
        branch -> 40-hex commit. Files may be added while the server runs.
        """
        if kind not in ("models", "datasets"):
            raise ValueError(f"kind must be 'models' or 'datasets', got {kind!r}")
        repo = self.mirrors / kind / repo_id
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True)
            _git(repo, "init", "-q", "-b", "main")
        commits = {}
        for branch, files in branches.items():
            if _git(repo, "branch", "--list", branch):
                _git(repo, "checkout", "-q", branch)
            elif _git(repo, "branch", "--list", "main"):
                _git(repo, "checkout", "-q", "-b", branch, "main")
            else:  # an empty repo: the first branch starts from an empty tree
                _git(repo, "checkout", "-q", "--orphan", branch)
            for name, content in files.items():
                target = repo / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, Path):
                    shutil.copyfile(content, target)
                else:
                    target.write_bytes(content)
            _git(repo, "add", "-A")
            _git(repo, "commit", "-q", "--allow-empty", "-m", f"{branch}: {len(files)} file(s)")
            commits[branch] = _git(repo, "rev-parse", "HEAD")
        _git(repo, "checkout", "-q", next(iter(branches)))
        return commits

    def env(self, hf_home: str | Path) -> dict[str, str]:
        """Environment variables that send Hugging Face clients here, with a fresh cache ``hf_home``."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0",
                "HF_DATASETS_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_XET": "1"}

    def start(self, probe_repo: str, timeout: float = 60.0) -> None:
        """Start olah and wait until ``/api/models/<probe_repo>/revision/main`` answers 200.

        (``/`` answers 500 in the offline mode, so a repo's revision is the readiness probe.)
        Raises RuntimeError with olah's log when it exits or does not answer in time.
        """
        command = olah_command()
        if command is None:
            raise RuntimeError("olah-cli is not installed (pip install olah==0.5.4, in the dev extra)")
        dead = f"127.0.0.1:{_free_port()}"  # nothing listens there: olah can never reach an upstream
        config = self.root / "olah.toml"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {self.port}\n'
            f'hf-scheme = "http"\nhf-netloc = "{dead}"\nhf-lfs-netloc = "{dead}"\n'
            f'mirror-scheme = "http"\nmirror-netloc = "127.0.0.1:{self.port}"\n'
            f'mirror-lfs-netloc = "127.0.0.1:{self.port}"\n'
            f'repos-path = "{self.root / "olah-cache"}"\n'
            f'mirrors-path = ["{self.mirrors}"]\n'
            "[accessibility]\noffline = true\n"
        )
        self.log = self.root / "olah.log"
        began = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([command, "-c", str(config)], cwd=self.root, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        probe = f"{self.endpoint}/api/models/{probe_repo}/revision/main"
        while time.monotonic() - began < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"olah exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(probe, timeout=2) as response:
                    if response.status == 200:
                        self.started_in = time.monotonic() - began
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"olah did not answer {probe} within {timeout:g} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Stop the olah process (its own process group, by PID)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def reload_hub_constants(monkeypatch):
    """huggingface_hub reads HF_ENDPOINT / HF_HOME / offline at import: set its constants as a new process would."""
    import huggingface_hub.constants as constants

    home = Path(os.environ["HF_HOME"])
    offline = os.environ.get("HF_HUB_OFFLINE", "0") in ("1", "true")
    for name, value in {"ENDPOINT": os.environ["HF_ENDPOINT"], "HF_HOME": str(home),
                        "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": offline}.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        os.environ["HF_ENDPOINT"] + "/{repo_id}/resolve/{revision}/{filename}")
    # datasets copies them into its own config at its import: a test that imported it earlier in this
    # process (another test, or a pytest-xdist worker's earlier test) left the defaults there.
    if "datasets.config" in sys.modules:
        config = sys.modules["datasets.config"]
        endpoint, cache = os.environ["HF_ENDPOINT"], home / "datasets"
        datasets_offline = offline or os.environ.get("HF_DATASETS_OFFLINE", "0") in ("1", "true")
        for name, value in {"HF_ENDPOINT": endpoint,
                            "HUB_DATASETS_URL": endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}",
                            "HF_HUB_OFFLINE": offline, "HF_DATASETS_OFFLINE": datasets_offline,
                            "HF_CACHE_HOME": str(home), "HF_DATASETS_CACHE": str(cache),
                            "HF_MODULES_CACHE": str(home / "modules"),
                            "DOWNLOADED_DATASETS_PATH": str(cache / "downloads"),
                            "EXTRACTED_DATASETS_PATH": str(cache / "downloads" / "extracted")}.items():
            monkeypatch.setattr(config, name, value)
