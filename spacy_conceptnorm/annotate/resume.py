"""Resuming the `annotate` command: the ids OUTPUT already holds, a half-written last record cut off."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import warnings
from pathlib import Path

import srsly

from ..errors import ConceptNormError, Errors
from ..io.corpus import PUBTATOR_TEXT_LINE

MAX_LINE_BYTES = 1 << 28  # a record line longer than this is not one of ours (256 MiB)


def check_output(path: Path) -> None:
    """Raise ConceptNormError (E986) unless OUTPUT can be appended to: a regular file (or none yet) in a directory
    that exists or can be made, writable, on a device with space left. Called before the model loads."""
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        detail = f"it is {what}; annotate appends to OUTPUT and resumes from it"
        raise ConceptNormError(Errors.E986.format(path=path, detail=detail))
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
        if shutil.disk_usage(path.parent).free == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as e:
        if not existed:
            with contextlib.suppress(OSError):
                path.unlink()
        detail = f"{e.filename} is a file, not a directory" if isinstance(e, FileExistsError) else e.strerror or e
        raise ConceptNormError(Errors.E986.format(path=path, detail=detail)) from None


def read_done_ids(path: Path, output_format: str) -> set[str]:
    """Ids of the complete records already in OUTPUT. A partial record at its end (left by an interrupted run) is
    cut off; any other line that is not one of ours stops the run rather than be appended to."""
    if not path.exists():
        return set()
    check_output(path)
    done: set[str] = set()
    with open(path, "r+b") as f:
        pos = end = 0  # bytes read; the end of the last complete record
        block_id = None
        for lineno in itertools.count(1):
            raw = f.readline(MAX_LINE_BYTES + 1)  # bounded: no line is read whole into memory past the limit
            if len(raw) > MAX_LINE_BYTES:
                raise ConceptNormError(
                    Errors.E805.format(path=path, line=lineno, expected=f"lines under {MAX_LINE_BYTES} bytes")
                )
            if not raw.endswith(b"\n"):
                break  # the end, or a half-written last line
            pos += len(raw)
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if output_format == "jsonl":
                try:
                    record = srsly.json_loads(line)
                    done.add(str(record["id"]))
                except (ValueError, KeyError, TypeError):
                    raise ConceptNormError(
                        Errors.E805.format(path=path, line=lineno, expected="a JSON record with an id")
                    ) from None
                end = pos
            elif line and block_id is None:
                match = PUBTATOR_TEXT_LINE.fullmatch(line)
                if not match or match[2] != "t":
                    raise ConceptNormError(Errors.E805.format(path=path, line=lineno, expected="a 'PMID|t|title' line"))
                block_id = match[1]
            elif not line and block_id is not None:  # the blank line that ends a block
                done.add(block_id)
                block_id, end = None, pos
        size = f.seek(0, os.SEEK_END)
        if end < size:
            warnings.warn(Errors.E806.format(path=path, count=size - end), stacklevel=2)
            f.truncate(end)
    return done
