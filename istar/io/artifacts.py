"""Artifacts on disk: one atomic writer, and content hashes recorded at write time, checked at read time.

Atomic writes: write to a temporary name in the same folder, then rename. A job killed
half-way leaves either the old file or none, never a truncated one, so Snakemake and DVC
never mistake a partial output for a finished one; every file ends with the mode the umask
gives an ordinary new file (not ``mkstemp``'s 0600).

Integrity: every artifact the project writes and later reads carries the sha256 of its
content, recorded where the artifact's provenance lives:

- safetensors files (Σ_S): :func:`save_tensors` stores the hash of the tensors
  in the file's own metadata (``sha256``); :func:`load_tensors` recomputes it;
- a folder written by another library (a model from ``save_pretrained``):
  :func:`record_digests` writes ``digests.json`` (file → sha256) into it,
  :func:`verify_digests` checks every file it lists;
- files whose provenance is a JSON written after them (parquet splits → ``meta.json``):
  :func:`file_digest` at write time, :func:`verify_file` at read time;
- JSON results (measurements): :func:`write_json` with ``digest=True`` adds the hash of
  the rest of the object as key ``sha256``; :func:`read_json` checks it and turns an
  unreadable file into the same error.

A mismatch raises :class:`DamagedArtifactError`, one line naming the file, saying it is
damaged and giving the command that rebuilds it. Timestamps play no part: a damaged file
with its old modification time is caught too.

Storage: a write the disk refuses raises a :class:`StorageError` naming the path, what was
kept and the fix. :func:`atomic_path` turns a full disk (or quota) into :class:`OutOfSpaceError`
(the previous file is kept, the partial one removed: the same command redoes the write once
space is freed) and a folder that cannot be written into :class:`NotWritableError`;
:func:`check_writable` raises the latter before a step loads its model and data, and
:func:`check_free_space` raises :class:`NotEnoughSpaceError` before a step writes what it knows
will not fit. :func:`name_problem` says why a name cannot be a file name on the common file
systems (length, characters), so a configuration is refused before any job writes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["NAME_MAX", "TEMP_NAME_EXTRA", "NOT_IN_NAMES", "name_problem", "StorageError", "OutOfSpaceError", "NotEnoughSpaceError", "format_bytes", "check_free_space", "NotWritableError", "storage_errors", "check_writable", "atomic_path", "write_json", "write_text", "replace_directory", "DamagedArtifactError",
           "file_digest", "verify_file", "record_digests", "verify_digests", "DIGESTS", "tensor_digest",
           "save_tensors", "load_tensors", "read_json", "verify_artifact"]

DIGESTS = "digests.json"
NAME_MAX = 255
"""The longest file or folder name, in bytes, of the common file systems (ext4, XFS, Btrfs, ZFS, APFS;
NTFS and exFAT count 255 UTF-16 units)."""
TEMP_NAME_EXTRA = len(".") + len(".") + 8 + len(".tmp")
"""What :func:`atomic_path` adds to a file's name for its temporary copy (``.NAME.`` + mkstemp's 8
random characters + ``.tmp``): a name the project writes must leave room for it."""
NOT_IN_NAMES = frozenset('/\\:*?"<>|') | frozenset(map(chr, range(32)))
"""Characters a file or folder name cannot hold on one of the common file systems (``/`` and NUL
anywhere; the rest on NTFS, exFAT and SMB shares), control characters included."""


class DamagedArtifactError(ValueError):
    """A file whose content is not what was written; the message says how to rebuild it."""

    def __init__(self, path, problem: str, target=None, fix: str | None = None):
        self.path, self.problem = Path(path), problem
        fix = fix or (f"rebuild it with `snakemake --forcerun {path if target is None else target}` (or delete it and "
                      "run the step that wrote it again)")
        super().__init__(f"{path} is damaged ({problem}): {fix}")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a file the project writes on a common file system (one phrase), or None."""
    bad = sorted({char for char in name if char in NOT_IN_NAMES})
    if bad:
        return f"holds {', '.join(map(repr, bad))}, which file systems do not allow in a name"
    if name in ("", ".", ".."):
        return "is not a usable name"
    size, room = len(name.encode("utf-8")), NAME_MAX - TEMP_NAME_EXTRA
    if size > room:
        return (f"is {size} bytes long: file systems take names of at most {NAME_MAX} bytes, and a write adds "
                f"{TEMP_NAME_EXTRA} for its temporary copy, so at most {room}")
    return None


class StorageError(OSError):
    """A write the file system refused; the message names the path, what was kept and the fix."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.errno = code


class OutOfSpaceError(StorageError):
    """No space (or quota) left while writing ``path``; ``kept`` says what is still there."""

    def __init__(self, path, kept: str):
        self.path = Path(path)
        super().__init__(f"no space left on the disk of {path} while writing it ({_free_space(self.path)} free "
                         f"now): {kept}. Free space there (`df -h {_existing(self.path)}`) and run the same "
                         "command again", errno.ENOSPC)


class NotEnoughSpaceError(StorageError):
    """Found before any work: the disk of ``folder`` has less free space than a step will write there."""

    def __init__(self, folder, needed: int, free: int, what: str, done: str):
        super().__init__(f"not enough free space for {folder}: {what}, about {format_bytes(needed)} more than is "
                         f"there now, but the disk has {format_bytes(free)} free: free at least "
                         f"{format_bytes(needed - free)} more (`df -h {_existing(Path(folder))}`) or choose an output "
                         f"folder on another disk, and run the same command again; {done}", errno.ENOSPC)


def format_bytes(size: int) -> str:
    """A size for a message: ``12.3 MiB``, ``1.25 GiB``."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def check_free_space(folder, needed: int, what: str, done: str) -> None:
    """Raise :class:`NotEnoughSpaceError` unless the disk of ``folder`` has ``needed`` bytes free
    (``what``: what needs them; ``done``: what was done so far, for the message)."""
    free = _free_bytes(Path(folder))
    if free < needed:
        raise NotEnoughSpaceError(folder, needed, free, what, done)


class NotWritableError(StorageError):
    """An output folder that cannot be written (read-only file system, permissions)."""

    def __init__(self, folder, reason: str, code: int):
        super().__init__(f"cannot write to {folder} ({reason}): choose an output folder on a writable disk, or make "
                         "this one writable, and run the command again; nothing was changed", code)


# A full disk or quota, by errno or (safetensors: an error with text only) by message. torch's zip
# writer reports it only as a RuntimeError "unexpected pos …" or "file write failed": an I/O
# error while less than NEARLY_FULL is free (partial output still in place) counts as a full disk.
_OUT_OF_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_OUT_OF_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "File too large", "os error 28")
_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
NEARLY_FULL = 1 << 20  # bytes


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (where ``df`` and ``statvfs`` can look)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(_existing(path))
    return stats.f_bavail * stats.f_frsize


def _free_space(path: Path) -> str:
    try:
        return f"{_free_bytes(path) / 2**20:.1f} MiB"
    except OSError:
        return "unknown"


def _is_out_of_space(error: BaseException, path) -> bool:
    """Whether ``error``, raised while writing ``path``, means the disk (or quota) is full."""
    if not isinstance(error, (OSError, RuntimeError)) and "Safetensor" not in type(error).__name__:
        return False  # not an I/O failure (KeyboardInterrupt, a bug in the writer, …)
    seen = set()  # the error and its causes, each once
    while error is not None and id(error) not in seen:
        if (isinstance(error, OSError) and error.errno in _OUT_OF_SPACE) or any(
                text in str(error) for text in _OUT_OF_SPACE_TEXT):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    try:
        return _free_bytes(Path(path)) < NEARLY_FULL
    except OSError:
        return False


@contextmanager
def storage_errors(path, kept: str | None = None):
    """Run a write of ``path`` (a file or a folder): a full disk raises :class:`OutOfSpaceError`, a
    refused write :class:`NotWritableError`, both naming ``path``. ``kept``: what is still there
    (default: the previous ``path`` if it exists, else that nothing was written). Wrap the write
    itself, inside any clean-up of its partial output: the partial output's size is what shows a full disk."""
    path = Path(path)
    existed = path.exists()
    try:
        yield
    except StorageError:
        raise
    except BaseException as error:
        if _is_out_of_space(error, path):
            raise OutOfSpaceError(path, kept or (f"the previous {path.name} is kept unchanged" if existed
                                                 else f"{path.name} was not written")) from error
        if isinstance(error, OSError) and error.errno in _NOT_WRITABLE:
            raise NotWritableError(path.parent, error.strerror, error.errno) from error
        raise


def check_writable(*folders) -> None:
    """Create each folder (with its parents) and a temporary file in it (gone once closed): a folder that
    cannot be written raises :class:`NotWritableError` before any work starts."""
    for folder in map(Path, folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as error:
            if error.errno in _OUT_OF_SPACE:
                raise OutOfSpaceError(folder, "nothing was written") from None
            raise NotWritableError(folder, error.strerror or str(error), error.errno or errno.EIO) from None


def _normal_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success rename it to ``path`` (umask's normal mode).

    A full disk or a refused write raises a :class:`StorageError` naming ``path`` (see
    :func:`storage_errors`), after the partial file is removed.
    """
    path, tmp = Path(path), None
    try:
        with storage_errors(path):  # which translates a failure before the partial file is removed
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            yield Path(tmp)
            # Set after the writer ran: some writers (safetensors) recreate the file with their own mode.
            os.chmod(tmp, _normal_mode())
            with open(tmp, "rb+") as handle:  # on disk before the rename, so a crash cannot leave it empty
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _json_digest(data: dict) -> str:
    """sha256 of a JSON object's canonical form (sorted keys, no spaces), without its own ``sha256`` key."""
    body = {key: value for key, value in data.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def write_json(path, data, digest: bool = False):
    """Write ``data`` as indented JSON (atomically); ``digest``: add its content hash as key ``sha256``.

    Returns what was written (``data``, with ``sha256`` when ``digest``)."""
    if digest:
        data = {**json.loads(json.dumps(data, default=str)), "sha256": None}
        data["sha256"] = _json_digest(data)
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return data


def read_json(path, target=None):
    """A JSON file the project wrote, its ``sha256`` checked if it has one.

    Unreadable, truncated or changed content → :class:`DamagedArtifactError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run the step that writes it first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedArtifactError(path, f"not valid JSON: {error}", target) from None
    if isinstance(data, dict) and "sha256" in data and _json_digest(data) != data["sha256"]:
        raise DamagedArtifactError(path, "its content differs from the sha256 recorded when it was written", target)
    return data


def replace_directory(staging, final) -> None:
    """Move a fully written ``staging`` folder to ``final``, replacing what was there.

    Every file in it first gets the umask's normal mode: ``save_pretrained`` and accelerate's
    ``save_state`` write safetensors files mode 0600, which other users of a shared project
    folder could not read.
    """
    staging, final = Path(staging), Path(final)
    mode = _normal_mode()
    for path in staging.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- file digests


def file_digest(path) -> str:
    """The sha256 (hex) of a file's bytes, read in chunks (never whole into memory)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify_file(path, expected: str | None, target=None) -> None:
    """Raise :class:`DamagedArtifactError` unless ``path`` hashes to ``expected`` (None: nothing recorded, no check)."""
    if expected is None:
        return
    actual = file_digest(path)
    if actual != expected:
        raise DamagedArtifactError(path, f"sha256 {actual[:12]}… differs from the {expected[:12]}… recorded when it "
                                         "was written", target)


def record_digests(folder) -> dict[str, str]:
    """Write ``folder/digests.json``: the sha256 of every file under ``folder`` (relative path → hex).

    Call it once the folder is complete (e.g. after ``save_pretrained``); returns the mapping.
    """
    folder = Path(folder)
    digests = {str(p.relative_to(folder)): file_digest(p) for p in sorted(folder.rglob("*"))
               if p.is_file() and p.name != DIGESTS}
    write_json(folder / DIGESTS, digests)
    return digests


def verify_digests(folder, target=None) -> None:
    """Check every file listed in ``folder/digests.json``; a missing or changed one raises
    :class:`DamagedArtifactError` naming it (the rebuild target is the folder). A folder
    without ``digests.json`` (a pretrained model from the hub or a package) is not checked."""
    folder = Path(folder)
    target = target if target is not None else folder
    if not (folder / DIGESTS).is_file():
        return
    for name, expected in read_json(folder / DIGESTS, target).items():
        path = folder / name
        if not path.is_file():
            raise DamagedArtifactError(path, f"missing from {folder}, whose {DIGESTS} lists it", target)
        verify_file(path, expected, target)


# ----------------------------------------------------------------------------- safetensors


def tensor_digest(tensors) -> str:
    """sha256 (hex) of named tensors: names in sorted order, each with dtype, shape and raw bytes."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_tensors(path, tensors, metadata: dict[str, str] | None = None) -> None:
    """Write named tensors to a safetensors file atomically, their :func:`tensor_digest` in the metadata (``sha256``)."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {**(metadata or {}), "sha256": tensor_digest(tensors)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def load_tensors(path, target=None):
    """(tensors, metadata) of a file written by :func:`save_tensors`, after checking its content hash.

    An unreadable file, or tensors whose hash differs from the recorded one, raise
    :class:`DamagedArtifactError`; a file without a recorded hash is returned unchecked.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run the step that writes it first")
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, RuntimeError, ValueError) as error:
        raise DamagedArtifactError(path, f"not a readable safetensors file: {error}", target) from None
    expected = metadata.get("sha256")
    if expected is not None and tensor_digest(tensors) != expected:
        raise DamagedArtifactError(path, "its tensors differ from the sha256 recorded when it was written", target)
    return tensors, metadata


def verify_artifact(path, target=None) -> None:
    """Check one existing artifact by its kind (a missing path or an unknown kind is not checked).

    A folder: its ``digests.json``; ``*.parquet``: the hash in the ``meta.json`` beside it;
    ``*.safetensors`` and Σ_S ``*.pt``: the tensors' hash; ``*.json``: its syntax and
    ``sha256`` if it has one, and for a prepared task folder's ``meta.json`` (the workflow's
    handle on the folder) every split it lists (``split_sha256``). Raises :class:`DamagedArtifactError`.
    """
    path = Path(path)
    if path.is_dir():
        verify_digests(path, target)
    elif path.suffix == ".parquet" and path.is_file() and (path.parent / "meta.json").is_file():
        verify_file(path, read_json(path.parent / "meta.json").get("split_sha256", {}).get(path.name), target)
    elif path.suffix in (".safetensors", ".pt") and path.is_file():
        load_tensors(path, target)
    elif path.suffix == ".json" and path.is_file():
        content = read_json(path, target)
        for name in content.get("split_sha256", {}) if isinstance(content, dict) else ():
            verify_artifact(path.parent / name, target)  # each split against this meta.json
