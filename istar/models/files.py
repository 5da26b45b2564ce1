"""Whether the weight files of a pretrained model are complete, from their headers and sizes alone.

A model folder or GGUF file cut short (a copy or download that stopped, a full disk) would
otherwise pass every check that reads only ``config.json`` and fail seconds into a job with a
library's traceback that names neither the file nor the cause. Both formats state in their
header where every tensor's bytes lie, so the size the file must have is known without
reading the weights:

- safetensors: an 8-byte little-endian header length N, N bytes of JSON whose entries give
  each tensor's ``data_offsets`` [begin, end) into the data that follows; the file holds
  exactly 8 + N + max(end) bytes;
- GGUF (v2, v3): magic ``GGUF``, version, tensor and key counts, the key/value pairs, one
  info per tensor (name, shape, ggml type, offset); the data start at the next multiple of
  ``general.alignment`` (default 32) after the infos, and every tensor's offset plus its
  size (elements / block size × block bytes of its type) must lie within the file.

Reading the headers takes milliseconds (GGUF: the tokenizer's vocabulary, ~50k strings),
so :func:`istar.pipeline.validate.validate_config` runs these checks before any job, and the loaders
again before ``from_pretrained``.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

__all__ = ["safetensors_problem", "folder_weights_problem", "gguf_problem"]

_REFETCH = "copy or download it again (a transfer or a full disk can cut a file short)"


def safetensors_problem(path) -> str | None:
    """Why the safetensors file ``path`` is not complete, or None when its size matches its header."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return f"{size:,} bytes, but its header alone needs {8 + length:,}"
        try:
            header = json.loads(handle.read(length))
            ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError):
            return "its header is not a safetensors header"
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{size:,} bytes where its header describes {expected:,}"
    return None


def folder_weights_problem(folder) -> str | None:
    """One line naming the first incomplete ``*.safetensors`` file of a model folder and the fix, or None."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        if (problem := safetensors_problem(path)) is not None:
            return f"{path} is incomplete or damaged ({problem}): {_REFETCH}"
    return None


# GGUF value types (gguf.GGUFValueType): struct format of the fixed-size ones; 8 = string, 9 = array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Reader:
    def __init__(self, handle, order: str):
        self.handle, self.order = handle, order

    def read(self, size: int) -> bytes:
        """The next ``size`` bytes; EOFError where the file ends first (inside the header)."""
        if size < 0 or len(data := self.handle.read(size)) < size:
            raise EOFError
        return data

    def take(self, fmt: str):
        return struct.unpack(self.order + fmt, self.read(struct.calcsize(self.order + fmt)))[0]

    def string(self) -> bytes:
        return self.read(self.take("Q"))

    def value(self, kind: int):
        """A key's value: scalars and strings returned, arrays skipped (None)."""
        if kind == _GGUF_STRING:
            return self.string()
        if kind == _GGUF_ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _GGUF_SCALARS:
                self.read(count * struct.calcsize(self.order + _GGUF_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item)
            return None
        if kind not in _GGUF_SCALARS:
            raise ValueError(f"unknown value type {kind}")
        return self.take(_GGUF_SCALARS[kind])


def gguf_problem(path) -> str | None:
    """One line naming the GGUF file ``path`` when it is incomplete or not GGUF, with the fix; None when complete."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"GGUF":
                return f"{path} is not a GGUF file (it does not start with 'GGUF'): {_REFETCH}"
            reader = _Reader(handle, "<")
            # GGUF files are little-endian unless written for a big-endian machine (version bytes swapped).
            reader.order = "<" if reader.take("I") < 0x10000 else ">"
            n_tensors, n_keys = reader.take("Q"), reader.take("Q")
            alignment = 32
            for _ in range(n_keys):
                key = reader.string()
                value = reader.value(reader.take("I"))
                if key == b"general.alignment" and isinstance(value, int):
                    alignment = value
            end = 0
            for _ in range(n_tensors):
                reader.string()
                dims = [reader.take("Q") for _ in range(reader.take("I"))]
                kind, offset = reader.take("I"), reader.take("Q")
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                end = max(end, offset + math.prod(dims) // block * block_bytes)
            start = -(-handle.tell() // alignment) * alignment
    except EOFError:
        return f"{path} is incomplete: it ends ({size:,} bytes) inside its header: {_REFETCH}"
    except (ValueError, KeyError) as error:
        return f"{path} is damaged (its header is not readable GGUF: {error}): {_REFETCH}"
    if start + end > size:
        return f"{path} is incomplete: {size:,} bytes where its header describes {start + end:,}: {_REFETCH}"
    return None
