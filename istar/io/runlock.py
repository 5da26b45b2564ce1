"""One writer per run folder: a lock file naming the process that writes the folder.

``OUT/.istar-writer.lock`` holds the writer's PID, host, start time and command (JSON). The
writer keeps an exclusive ``flock`` on it for as long as it runs; the kernel (or the NFS lock
manager) drops the lock when the process ends, however it ends (SIGKILL included). So:

- a second writer finds the lock held and stops at once, naming the holder;
- a lock file whose lock is free was left by a writer that is gone (killed, its node lost): it
  is *stale*, and the new writer takes it over with one line naming the old holder;
- a writer that ends normally removes the file.

On a file system without ``flock`` (some Lustre mounts), the holder is judged by its PID: a
holder on this host whose PID no longer runs is stale; one on another host cannot be checked,
and the message says how to remove the file by hand.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_NAME", "FolderLockedError", "writer_lock"]

LOCK_NAME = ".istar-writer.lock"
_NO_FLOCK = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


class FolderLockedError(RuntimeError):
    """Another live process writes the folder; the message names it."""


def _describe(holder: dict) -> str:
    return (f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {holder.get('started', '?')}: "
            f"{holder.get('command', '?')})")


def _read(handle) -> dict:
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "{}")
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _pid_running(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True  # a process of another user, or an unreadable PID: assume it runs
    return True


def _acquire(path: Path):
    """Open ``path`` and hold its flock; returns (handle, flock_supported). Raises FolderLockedError."""
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(handle)
            handle.close()
            raise FolderLockedError(
                f"{path.parent} is being written by another run: {_describe(holder)} holds {path}. Wait for it to "
                "finish, or stop that process; two writers in one run folder would mix their states") from None
        except OSError as error:
            if error.errno in _NO_FLOCK:
                return handle, False
            handle.close()
            raise
        # The file may have been removed (released) between open and flock: lock the current one.
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle, True
        except FileNotFoundError:
            pass
        handle.close()


@contextmanager
def writer_lock(folder, print_fn=print):
    """Hold ``folder``'s writer lock while the block runs (the folder must exist and be writable).

    Raises :class:`FolderLockedError` when a live process holds it; a stale lock is taken over
    with one line through ``print_fn``.
    """
    path = Path(folder) / LOCK_NAME
    handle, flock_supported = _acquire(path)
    try:
        holder = _read(handle)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        if holder and not flock_supported:
            if holder.get("host") != me["host"]:
                raise FolderLockedError(
                    f"{path} names a writer on another host, {_describe(holder)}, and this file system cannot tell "
                    f"whether it still runs: if it does not, remove {path} and run the command again")
            if holder.get("pid") != me["pid"] and _pid_running(holder.get("pid")):
                raise FolderLockedError(f"{path.parent} is being written by another run: {_describe(holder)} "
                                        f"holds {path}; wait for it to finish, or stop that process")
        if holder:
            print_fn(f"taking over the stale writer lock {path} of {_describe(holder)}: that process is gone")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({**me, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 "command": " ".join(sys.argv)[:500]}) + "\n")
        handle.flush()
        yield path
    finally:
        # Removed while still locked: a process that opened it meanwhile finds, once it holds the
        # lock, that the path no longer names its file, and starts over (:func:`_acquire`).
        path.unlink(missing_ok=True)
        handle.close()
