"""Text files that come from outside the project (a data mirror's release files, config files, a
survey's text sample): read as UTF-8, or refused with one line naming the file, line and column.

Python's own error (``'utf-8' codec can't decode byte 0xe9 in position 1571``) names neither the
file nor the line, and its position counts bytes of whatever chunk the reader had buffered.
"""

from __future__ import annotations

import codecs
from pathlib import Path

__all__ = ["NotUtf8Error", "read_utf8"]


class NotUtf8Error(ValueError):
    """A file that is not valid UTF-8; the message names the file, line and column of the first bad byte."""


def read_utf8(path, skip_bom: bool = False) -> str:
    """The text of the file ``path``, decoded as UTF-8; ``skip_bom``: drop a leading byte-order mark.

    Raises :class:`NotUtf8Error` naming ``path``, the line and the column (characters, from 1)
    of the first byte that is not UTF-8.
    """
    data = Path(path).read_bytes()
    start = len(codecs.BOM_UTF8) if skip_bom and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        position = start + error.start
        line_start = data.rfind(b"\n", 0, position) + 1
        line = data.count(b"\n", 0, position) + 1
        column = len(data[line_start:position].decode("utf-8", errors="replace")) + 1
        raise NotUtf8Error(
            f"{path}, line {line}, column {column}: byte 0x{data[position]:02x} is not valid UTF-8 ({error.reason}): "
            "the file is damaged or in another encoding (Latin-1, Windows-1252?); convert it to UTF-8 (e.g. "
            "`iconv -f latin1 -t utf-8`) or copy it again") from None
