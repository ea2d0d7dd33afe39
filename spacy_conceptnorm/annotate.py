"""Batch annotation: `python -m spacy_conceptnorm annotate MODEL INPUT OUTPUT`.

Documents stream from INPUT through `nlp.pipe` and are appended to OUTPUT one batch at a time, so memory stays
constant (apart from the set of document ids). A first Ctrl-C stops reading input, finishes and writes the documents
in flight, then exits; a second stops at once. Either way OUTPUT holds complete records (and at worst a half-written
last one, which the next run cuts off before it appends the documents still missing).

Input formats (`--input-format`, else guessed from INPUT):
- "jsonl": one `{"id": ..., "text": ...}` object per line (id a string or an integer);
- "pubtator": title/abstract blocks (`PMID|t|title`, `PMID|a|abstract`, annotation lines ignored) separated by
  blank lines; the text is title + "\\n" + abstract, so offsets follow the PubTator convention;
- "txt": a .txt file is one document per non-blank line, id `<file name>:<line number>`; a directory is one
  document per .txt file below it, id = its path relative to the directory, text = the whole file.
Output formats (`--output-format`, else from OUTPUT's extension): "jsonl" (.jsonl), one object per document
(see `entity_record`), or "pubtator" (.pubtator, .txt): per document a title line (text up to its first newline),
an abstract line (the rest, newlines written as spaces so offsets hold), `PMID\\tstart\\tend\\ttext\\tlabel\\tid`
lines and a blank line.

Ids are compared as strings. A record whose id was seen before in the input is a duplicate: warned about and
skipped. A text longer than `nlp.max_length` is annotated in pieces cut at newlines (else spaces) and merged back.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import spacy
import srsly
from spacy.language import Language
from spacy.tokens import Span
from tqdm import tqdm

from . import component  # noqa: F401  (registers the span extensions read below)
from .errors import ConceptNormError, Errors
from .util import read_lines

INPUT_FORMATS = ("jsonl", "pubtator", "txt")
OUTPUT_FORMATS = ("jsonl", "pubtator")
MAX_WARNINGS = 20  # input problems warned about one by one; the rest are only counted
PUBTATOR_TEXT_LINE = re.compile(r"([^|\t]+)\|([ta])\|(.*)")
NOT_IN_PUBTATOR_ID = re.compile(r"[|\t\r\n]")

Report = Callable[[Path, int, str], None]  # (file, line number, problem) of an input record
Record = tuple[int, object, str]  # (line number, id, text)


@dataclass
class Summary:
    written: int = 0
    skipped: int = 0  # already in OUTPUT from an earlier run
    malformed: int = 0
    duplicates: int = 0
    entities: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.written / self.seconds if self.seconds else 0.0
        return (
            f"{self.written} documents written, {self.skipped} skipped (already done), {self.malformed} malformed, "
            f"{self.duplicates} duplicate ids, {self.entities} entities, {rate:.1f} docs/s, {self.seconds:.1f} s"
        )


# --- readers: generators of (line number, id, text) ----------------------------------------------------------------
def _lines(path: Path, report: Report) -> Iterator[tuple[int, str | None]]:
    """(line number, line without its newline, a leading BOM dropped); a line that is not UTF-8 is reported and
    given as None."""
    def not_utf8(lineno: int, error: UnicodeDecodeError) -> None:
        report(path, lineno, f"not UTF-8 (byte {error.start} of the line)")

    for lineno, line in read_lines(path, on_error=not_utf8):
        yield lineno, line.removeprefix("\ufeff") if lineno == 1 and line else line


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
        else:
            yield lineno, doc_id, obj["text"]


def read_pubtator(path: Path, report: Report) -> Iterator[Record]:
    """PubTator blocks; a block with a line that does not fit (or is not UTF-8) is reported once and skipped."""
    pmid, parts, first, bad = None, {}, None, False
    for lineno, line in chain(_lines(path, report), [(0, "")]):  # the sentinel ends the last block
        if line is not None and not line.strip():
            if first is not None and not bad:
                if "t" in parts:
                    yield first, pmid, parts["t"] + ("\n" + parts["a"] if parts.get("a") else "")
                else:
                    report(path, first, "malformed PubTator block: no 'PMID|t|title' line")
            pmid, parts, first, bad = None, {}, None, False
            continue
        first = first or lineno
        if bad or line is None:  # one report per block (an undecodable line is reported already)
            bad = True
            continue
        match = PUBTATOR_TEXT_LINE.fullmatch(line)
        if match and pmid not in (None, match[1]):
            problem = f"PMID {match[1]} inside the block of PMID {pmid} (is a blank line missing?)"
        elif match and match[2] in parts:
            problem = f"a second '|{match[2]}|' line"
        elif match:
            pmid, parts[match[2]] = match[1], match[3]
            continue
        elif "t" not in parts:
            problem = "expected a 'PMID|t|title' line"
        elif line.startswith(pmid + "\t"):
            continue  # an annotation line: the pipeline makes its own
        else:
            problem = f"expected a tab-separated annotation line of PMID {pmid}"
        report(path, lineno, f"malformed PubTator block: {problem}")
        bad = True


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


READERS = {"jsonl": read_jsonl, "pubtator": read_pubtator, "txt": read_txt}


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


def detect_output_format(path: Path) -> str:
    formats = {".jsonl": "jsonl", ".pubtator": "pubtator", ".txt": "pubtator"}
    if path.suffix.lower() not in formats:
        raise ConceptNormError(Errors.E803.format(path=path))
    return formats[path.suffix.lower()]


# --- writers ------------------------------------------------------------------------------------------------------
def _top_score(candidates: list | None) -> float | None:
    return round(float(candidates[0][1]), 4) if candidates else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def entity_record(ent: Span, offset: int = 0) -> dict:
    """One entity of the JSONL output. `score` is the best candidate's score (of ent._.kb_ents); for a composite,
    the lowest of its parts' best scores; `confidence` is `ent._.kb_confidence`, the probability that the link is
    right; `parts` gives each part (text, concept_id, score, confidence, name, stage)."""
    parts = ent._.kb_parts or []
    part_records = [
        {"text": p["text"], "concept_id": p["kb_id"], "score": _top_score(p["candidates"]),
         "confidence": _rounded(p.get("confidence")), "name": p["name"], "stage": p["stage"]}
        for p in parts
    ]  # fmt: skip
    scores = [p["score"] for p in part_records if p["score"] is not None]
    record = {
        "start": ent.start_char + offset,
        "end": ent.end_char + offset,
        "text": ent.text,
        "label": ent.label_,
        "concept_id": ent.kb_id_ or None,
        "score": min(scores) if scores else None,
        "confidence": _rounded(ent._.kb_confidence),
        "name": ent._.kb_name,
        "stage": ent._.kb_stage,
    }
    if len(part_records) > 1:
        record["parts"] = part_records
    return record


def jsonl_record(doc_id: object, text: str, entities: list[dict], include_text: bool) -> str:
    record = {"id": doc_id, "text": text} if include_text else {"id": doc_id}
    return srsly.json_dumps({**record, "entities": entities}) + "\n"


def pubtator_record(doc_id: object, text: str, entities: list[dict], include_text: bool) -> str:
    """A PubTator block; the text is always written (PubTator readers need it, and resume reads the title line)."""
    title, _, abstract = text.partition("\n")
    lines = [f"{doc_id}|t|{_one_line(title)}", f"{doc_id}|a|{_one_line(abstract)}"]
    for e in entities:
        lines.append(
            f"{doc_id}\t{e['start']}\t{e['end']}\t{_one_line(e['text'])}\t{e['label']}\t{e['concept_id'] or ''}"
        )
    return "\n".join(lines) + "\n\n"


def _one_line(text: str) -> str:
    """Line breaks and tabs as spaces: same length, so offsets hold."""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


WRITERS = {"jsonl": jsonl_record, "pubtator": pubtator_record}


# --- resume -------------------------------------------------------------------------------------------------------
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


# --- the run ------------------------------------------------------------------------------------------------------
@contextmanager
def _stop_on_sigint(stop: list[BaseException]) -> Iterator[None]:
    """A first Ctrl-C asks the run to read no more input and finish the documents in flight; a second one stops at
    once. Raising inside `nlp.pipe(n_process>1)` would leave its workers blocked on their pipes while it waits for
    them, so the second Ctrl-C ends them first. (Forked workers inherit the handler: there it changes nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if stop:
            for child in multiprocessing.active_children():
                child.terminate()
            raise KeyboardInterrupt
        stop.append(KeyboardInterrupt())

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def split_text(text: str, limit: int) -> list[tuple[int, str]]:
    """(offset, piece) of a text cut into pieces of at most `limit` characters, at a newline, else a space."""
    pieces, start = [], 0
    while len(text) - start > limit:
        window = (start + limit // 2, start + limit)  # cut in the second half of the piece
        cut = text.rfind("\n", *window)
        cut = cut if cut > start else text.rfind(" ", *window)
        cut = cut if cut > start else start + limit
        pieces.append((start, text[start:cut]))
        start = cut
    pieces.append((start, text[start:]))
    return pieces


def annotate(
    model: str | Path | Language,
    input_path: str | Path,
    output_path: str | Path,
    *,
    n_process: int = 1,
    batch_size: int = 64,
    input_format: str = "auto",
    output_format: str = "auto",
    strict: bool = False,
    include_text: bool = False,
    progress: bool = True,
    max_length: int | None = None,
) -> Summary:
    """Annotate every document of INPUT with a pipeline and append the results to OUTPUT, resuming a previous run:
    ids already in OUTPUT are skipped and a half-written last record is cut off first.

    model (Union[str, Path, Language]): A saved pipeline directory (or package name) for `spacy.load`, or a pipeline.
    input_path (Union[str, Path]): A .jsonl, PubTator or .txt file, or a directory of .txt files.
    output_path (Union[str, Path]): The .jsonl or .pubtator file to append to.
    n_process (int): Processes for `nlp.pipe`; the output order is the input order whatever the number.
    batch_size (int): Documents per `nlp.pipe` batch, and per flushed write to OUTPUT.
    input_format (str): "auto", "jsonl", "pubtator" or "txt".
    output_format (str): "auto", "jsonl" or "pubtator".
    strict (bool): Fail at the first malformed input record or duplicate id (after writing the documents before
        it) instead of warning, counting and skipping it.
    include_text (bool): Write each document's text in the JSONL output.
    progress (bool): Show a progress bar (documents and documents/second).
    max_length (Optional[int]): Characters per spaCy doc; longer texts are annotated in pieces. Default:
        the pipeline's `nlp.max_length`.
    RETURNS (Summary): The counts of the run.
    """
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.exists():
        raise ConceptNormError(Errors.E804.format(path=input_path))
    if input_format == "auto":
        input_format = detect_input_format(input_path)
    if output_format == "auto":
        output_format = detect_output_format(output_path)
    for what, fmt, choices in (("input", input_format, INPUT_FORMATS), ("output", output_format, OUTPUT_FORMATS)):
        if fmt not in choices:
            raise ConceptNormError(Errors.E802.format(what=what, fmt=fmt, choices=choices))
    if input_path.is_dir() and input_format != "txt":
        raise ConceptNormError(Errors.E807.format(path=input_path, fmt=input_format))
    nlp = model if isinstance(model, Language) else spacy.load(model)
    if max_length:
        nlp.max_length = max_length
    limit = nlp.max_length
    summary = Summary()
    # A --strict error or a Ctrl-C ends the input instead of raising inside nlp.pipe: the documents before it
    # are finished and written, and the multiprocessing workers shut down cleanly; it is raised afterwards.
    stop: list[BaseException] = []

    def report(path: Path, line: int, problem: str, kind: str = "malformed") -> None:
        message = Errors.E801.format(path=path, line=line, problem=problem)
        if strict:
            stop.append(ConceptNormError(message))
            return
        setattr(summary, kind, getattr(summary, kind) + 1)
        if summary.malformed + summary.duplicates <= MAX_WARNINGS:
            last = summary.malformed + summary.duplicates == MAX_WARNINGS
            warnings.warn(message + (Errors.E808 if last else ""), stacklevel=2)

    done = read_done_ids(output_path, output_format)
    seen: set[str] = set()

    def texts() -> Iterator[tuple[str, tuple[object, int, bool]]]:
        """(text, (id, offset, last piece?)) for nlp.pipe, read lazily as the pipeline asks for more."""
        for line, doc_id, text in READERS[input_format](input_path, report):
            if stop:
                return
            key = str(doc_id)
            if key in seen:
                report(input_path, line, f"duplicate id {doc_id!r} (the first one is kept)", "duplicates")
                continue
            seen.add(key)
            if key in done:
                summary.skipped += 1
            elif output_format == "pubtator" and NOT_IN_PUBTATOR_ID.search(key):
                report(input_path, line, f"id {doc_id!r} cannot be a PubTator PMID ('|', tab or newline)")
            else:
                pieces = split_text(text, limit)
                if len(pieces) > 1:
                    message = Errors.E809.format(id=doc_id, length=len(text), limit=limit, pieces=len(pieces))
                    warnings.warn(message, stacklevel=2)
                for i, (offset, piece) in enumerate(pieces, 1):
                    yield piece, (doc_id, offset, i == len(pieces))

    def documents() -> Iterator[tuple[object, str, list[dict]]]:
        """(id, text, entity records), the pieces of a long text put back together (nlp.pipe keeps the order)."""
        pieces, entities = [], []
        for doc, (doc_id, offset, last) in nlp.pipe(
            texts(), as_tuples=True, n_process=n_process, batch_size=batch_size
        ):
            pieces.append(doc.text)
            entities.extend(entity_record(ent, offset) for ent in doc.ents)
            if last:
                yield doc_id, "".join(pieces), entities
                pieces, entities = [], []

    write_record = WRITERS[output_format]
    output_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (
        open(output_path, "a", encoding="utf-8", newline="") as f,
        tqdm(desc="annotate", unit="doc", disable=not progress, dynamic_ncols=True) as bar,
        _stop_on_sigint(stop),
    ):
        batch: list[str] = []
        writing = False  # true while a write may be half done: nothing may follow it then

        def flush() -> None:
            nonlocal writing
            writing = True
            f.write("".join(batch))
            f.flush()
            batch.clear()
            writing = False

        try:
            for doc_id, text, entities in documents():
                batch.append(write_record(doc_id, text, entities, include_text))
                summary.written += 1
                summary.entities += len(entities)
                bar.update()
                if len(batch) >= batch_size:
                    flush()
        finally:  # also on KeyboardInterrupt or a --strict error: keep every completed record
            if not writing:
                flush()
            f.flush()
            os.fsync(f.fileno())
            summary.seconds = time.perf_counter() - start
    if stop:
        raise stop[0]
    return summary
