"""The one reader of user files: every data set, corpus, pairs or task file a command is given is opened
here (a run folder a command did not write is opened through :func:`streetlamp.store.files.folder_file`).

* only a regular file is read: a FIFO, a device or a socket is refused before it is opened (opening a
  FIFO blocks until a writer comes; a device streams forever), a folder is named as a folder;
* text is UTF-8, with or without a byte-order mark (Excel's "CSV UTF-8" writes one): the mark is never
  part of the first column's name or the first line;
* a file that is not text (random bytes, a zip, an image) is one clear error naming the file and the
  offset of its first bad byte, never a ``UnicodeDecodeError``;
* a CSV is read by :func:`read_csv` (header + rows as dicts), refusing a row with more fields than the
  header and a malformed file in one line.
"""

from __future__ import annotations

import csv
import io
import os
import stat
from pathlib import Path

from ..errors import StreetlampError

KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
KINDS[stat.S_IFSOCK] = "a socket"


def user_file(path: Path | str, what: str = "file") -> Path:
    """``path`` when it is a regular file (symlinks followed), else one :class:`StreetlampError`."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise StreetlampError(f"{what} {p} does not exist") from None
    except OSError as e:
        raise StreetlampError(f"{what} {p} cannot be read ({e.strerror or e})") from None
    if stat.S_ISDIR(mode):
        raise StreetlampError(f"{what} {p} is a folder, not a file")
    if not stat.S_ISREG(mode):
        kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise StreetlampError(f"{what} {p} is {kind}: give a regular file")
    return p


def read_bytes(path: Path | str, what: str = "file") -> bytes:
    p = user_file(path, what)
    try:
        return p.read_bytes()
    except OSError as e:
        raise StreetlampError(f"{what} {p} cannot be read ({e.strerror or e})") from None


def decode(raw: bytes, path: Path | str, encoding: str = "utf-8") -> str:
    """UTF-8 text (a leading byte-order mark dropped), or one error: the file is not text."""
    if encoding == "utf-8":
        encoding = "utf-8-sig"
    try:
        s = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise StreetlampError(
            f"{path}: not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}; a binary file? save it as UTF-8 text)"
        ) from None
    if "\x00" in s:
        raise StreetlampError(f"{path}: not text (it holds NUL bytes, at offset {s.index(chr(0))}: a binary file?)")
    return s


def read_text(path: Path | str, what: str = "file", encoding: str = "utf-8") -> str:
    """The text of a user file (see the module docstring for what is refused)."""
    return decode(read_bytes(path, what), path, encoding)


def read_lines(path: Path | str, what: str = "file") -> list[str]:
    """The non-blank lines of a text file, stripped."""
    return [line.strip() for line in read_text(path, what).splitlines() if line.strip()]


def read_csv(path: Path | str, what: str = "file", delimiter: str | None = None) -> tuple[list[str], list[dict]]:
    """``(header, rows)`` of a CSV (or, by suffix or ``delimiter``, TSV) user file: each row a dict by header
    name. A row with more fields than the header, or a malformed file, is one error."""
    p = Path(path)
    text = read_text(p, what)
    sep = delimiter or ("\t" if p.suffix.lower() == ".tsv" else ",")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=sep)
        header = [str(c) for c in (reader.fieldnames or [])]
        rows = list(reader)
    except csv.Error as e:
        raise StreetlampError(f"{p}: malformed CSV ({e})") from None
    for i, r in enumerate(rows):
        if None in r:
            raise StreetlampError(f"{p}: row {i + 2} has more fields than the header")
    return header, rows
