"""Real system services for integration tests: Debian packages installed on demand, daemons
started in the foreground and stopped by the PIDs this module started (never by name)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

APT_TIMEOUT = 600
# `istar` under two gloo ranks on the CPU (prefix the venv's bin folder to the first item; set ACCELERATE_USE_CPU=true)
ACCELERATE_2_CPU = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "istar")


def missing_programs(programs: list[str]) -> list[str]:
    return [p for p in programs if not (shutil.which(p) or Path("/usr/sbin", p).exists())]


def program(name: str) -> str:
    found = shutil.which(name) or (str(Path("/usr/sbin", name)) if Path("/usr/sbin", name).exists() else None)
    if not found:
        raise FileNotFoundError(name)
    return found


def ensure_debian_packages(programs: list[str], packages: list[str]) -> str | None:
    """Install ``packages`` with apt when one of ``programs`` is missing.

    Returns None when every program is there (afterwards), else why not (a skip reason).
    """
    if not missing_programs(programs):
        return None
    if os.geteuid() != 0:
        return f"{', '.join(missing_programs(programs))} missing and not root (cannot apt-get install {' '.join(packages)})"
    if not shutil.which("apt-get"):
        return f"{', '.join(missing_programs(programs))} missing and no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    install = ["apt-get", *lock, "install", "-y", "-q", *packages]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
    if result.returncode != 0:  # stale package lists: update once and retry
        subprocess.run(["apt-get", *lock, "update", "-q"], env=env, capture_output=True, timeout=APT_TIMEOUT)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
    if result.returncode != 0:
        return f"apt-get install {' '.join(packages)} failed: {result.stderr.strip()[-500:]}"
    if missing_programs(programs):
        return f"{', '.join(missing_programs(programs))} still missing after apt-get install {' '.join(packages)}"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.2)
    return False


class Daemons:
    """Foreground daemons started by a test; ``stop()`` ends exactly those processes."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.processes: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, command: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.out", "w")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, **popen)
        log.close()
        self.processes.append((name, process))
        return process

    def check_running(self) -> str | None:
        """None if every daemon still runs, else which one died and the tail of its output."""
        for name, process in self.processes:
            if process.poll() is not None:
                return f"{name} exited with {process.returncode}: {self.output(name)[-1500:]}"
        return None

    def output(self, name: str) -> str:
        path = self.log_dir / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for name, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)
        self.processes.clear()


class MlflowServer:
    """A real MLflow tracking server on 127.0.0.1 (SQLite store under ``root``), stopped by its PID.

    ``mlflow server`` starts uvicorn and a job runner as its children; it runs in a session of
    its own, so ``stop()`` ends that process group (the group's id is the PID started here).
    """

    def __init__(self, root: Path, port: int | None = None):
        self.root = root
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "MlflowServer":
        import sys
        import urllib.request

        self.root.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        log = open(self.root / "server.log", "a")
        self.process = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}: {self.log()[-1500:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {timeout:.0f} s: {self.log()[-1500:]}")

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)
        try:  # children that outlived it (the group's id is still the PID started here)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # the children (uvicorn) must have let the port go before a test reuses it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)
