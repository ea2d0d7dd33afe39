"""Input readers of the `annotate` command: generators of (line number, id, text) records.

A record that cannot be read is given to `report(file, line number, problem)` and skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import srsly

from ..io.corpus import PUBTATOR_TEXT_LINE, parse_pubtator
from ..io.files import read_lines

INPUT_FORMATS = ("jsonl", "pubtator", "txt")

Report = Callable[[Path, int, str], None]  # (file, line number, problem) of an input record
Record = tuple[int, object, str]  # (line number, id, text)


def _lines(path: Path, report: Report) -> Iterator[tuple[int, str | None]]:
    """(line number, line without its newline, a leading BOM dropped by `read_lines`); a line that is not UTF-8 is
    reported and given as None."""

    def not_utf8(lineno: int, error: UnicodeDecodeError) -> None:
        report(path, lineno, f"not UTF-8 (byte {error.start} of the line)")

    yield from read_lines(path, on_error=not_utf8)


def read_jsonl(path: Path, report: Report) -> Iterator[Record]:
    for lineno, line in _lines(path, report):
        if line is None or not line.strip():
            continue
        try:
            obj = srsly.json_loads(line)
        except ValueError as e:
            report(path, lineno, f"invalid JSON ({e})")
            continue
        doc_id = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
            report(path, lineno, "no 'id' (a string or an integer)")
        elif not isinstance(obj.get("text"), str):
            report(path, lineno, "no 'text' string")
        elif not (_is_utf8(obj["text"]) and _is_utf8(str(doc_id))):
            report(path, lineno, "a lone surrogate (an escape such as \\ud800 that is no character) in the id or text")
        else:
            yield lineno, doc_id, obj["text"]


def _is_utf8(text: str) -> bool:
    """Whether a string can be written as UTF-8: JSON escapes can give lone surrogates, which cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_pubtator(path: Path, report: Report) -> Iterator[Record]:
    """PubTator blocks, read by `io.corpus.parse_pubtator`; a block with a line that does not fit (or is not UTF-8)
    is reported once and skipped. Annotation lines are not used: the pipeline makes its own."""

    def malformed(lineno: int, problem: str) -> None:
        report(path, lineno, f"malformed PubTator block: {problem}")

    for lineno, doc in parse_pubtator(_lines(path, report), malformed):
        yield lineno, doc.pmid, doc.text


def read_txt(path: Path, report: Report) -> Iterator[Record]:
    if path.is_dir():
        for file in sorted(path.rglob("*.txt")):
            raw = file.read_bytes()
            try:
                yield 1, file.relative_to(path).as_posix(), raw.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                report(file, raw[: e.start].count(b"\n") + 1, "not UTF-8")
        return
    for lineno, line in _lines(path, report):
        if line is not None and line.strip():
            yield lineno, f"{path.name}:{lineno}", line


READERS: dict[str, Callable[[Path, Report], Iterator[Record]]] = {
    "jsonl": read_jsonl,
    "pubtator": read_pubtator,
    "txt": read_txt,
}


def detect_input_format(path: Path) -> str:
    """From the extension (.jsonl, .pubtator; a directory is txt), else from the first non-blank line."""
    if path.is_dir():
        return "txt"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".pubtator"):
        return "pubtator" if suffix == ".pubtator" else "jsonl"
    with open(path, "rb") as f:
        first = f.read(1 << 16).lstrip().split(b"\n", 1)[0].decode("utf-8", "replace")
    if PUBTATOR_TEXT_LINE.match(first):  # NCBI-disease and BC5CDR name their PubTator files .txt
        return "pubtator"
    return "jsonl" if suffix != ".txt" and first.startswith("{") else "txt"
