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
