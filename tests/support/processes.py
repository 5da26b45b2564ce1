"""Processes on this machine, as the kill and signal tests look for them (Linux /proc)."""

from pathlib import Path


def processes_naming(text: str) -> list[int]:
    """PIDs of the live (not zombie) processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
    return found
