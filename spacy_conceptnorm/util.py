"""Small I/O helpers: line reading that names file and line on bad bytes, and atomic writes."""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import srsly

from .errors import ConceptNormError, Errors


def read_lines(path: str | Path, encoding: str = "utf-8") -> Iterator[tuple[int, str]]:
    """Yield (line number, line without its newline) from a text file, gzip-compressed if it ends in .gz.

    Bytes are decoded line by line so that a wrong encoding is reported with the file and line it is on.
    """
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise ConceptNormError(
                    Errors.E005.format(path=f"{path}:{lineno}", encoding=encoding, position=e.start, detail=e.reason)
                ) from None
            yield lineno, line.rstrip("\r\n")


_UMASK = os.umask(0o022)  # read the process umask (there is no getter) and put it back
os.umask(_UMASK)


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside `path` and move it into place only when the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it owner-only; give it a plain file's permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_msgpack(path: str | Path, data: object) -> None:
    with atomic_open(path) as f:
        f.write(srsly.msgpack_dumps(data))


def read_msgpack(path: str | Path, what: str, expected_format: str, expected_version: int) -> dict:
    """Read a msgpack file written by `write_msgpack` and check its format tag and version."""
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    try:
        data = srsly.msgpack_loads(path.read_bytes())
    except Exception as e:  # msgpack raises several unrelated types on truncation
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != expected_format or data.get("version") != expected_version:
        found_desc = f"{found}/{data.get('version')}" if isinstance(data, dict) else type(data).__name__
        raise ConceptNormError(
            Errors.E003.format(path=path, what=what, found=found_desc, expected=f"{expected_format}/{expected_version}")
        )
    return data
