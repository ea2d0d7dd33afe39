"""Resuming the `annotate` command: the ids OUTPUT already holds, a half-written last record cut off."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import srsly

from ..corpus import PUBTATOR_TEXT_LINE
from ..errors import ConceptNormError, Errors


def read_done_ids(path: Path, output_format: str) -> set[str]:
    """Ids of the complete records already in OUTPUT. A partial record at its end (left by an interrupted run) is
    cut off; any other line that is not one of ours stops the run rather than be appended to."""
    if not path.exists():
        return set()
    done: set[str] = set()
    with open(path, "r+b") as f:
        pos = end = 0  # bytes read; the end of the last complete record
        block_id = None
        for lineno, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                break  # a half-written last line
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
