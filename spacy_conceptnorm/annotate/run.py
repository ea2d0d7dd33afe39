"""The `annotate` run: documents from a reader through `nlp.pipe` to a writer, appended to OUTPUT in batches,
resuming what OUTPUT already holds (see the package docstring for the formats)."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from spacy.language import Language
from tqdm import tqdm

from ..errors import ConceptNormError, Errors
from ..io.pipelines import load
from ..ml.threads import workers_die_with_parent
from .interrupt import stop_on_sigint
from .readers import INPUT_FORMATS, READERS, detect_input_format
from .resume import check_output, read_done_ids
from .writers import OUTPUT_FORMATS, WRITERS, detect_output_format, entity_record

MAX_WARNINGS = 20  # input problems warned about one by one; the rest are only counted
NOT_IN_PUBTATOR_ID = re.compile(r"[|\t\r\n]")


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


def resolve_formats(input_path: Path, output_path: Path, input_format: str, output_format: str) -> tuple[str, str]:
    """The input and output formats ("auto" guessed from the paths), checked: ConceptNormError when INPUT is
    missing, a format unknown, or a directory not read as txt."""
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
    return input_format, output_format


def input_documents(
    input_path: Path,
    input_format: str,
    output_format: str,
    done: set[str],
    summary: Summary,
    strict: bool,
    stop: list[BaseException],
) -> Iterator[tuple[int, object, str]]:
    """(line number, id, text) of the INPUT documents still to annotate, read lazily; ends when `stop` is not
    empty. Ids in `done` are counted as skipped; a malformed record, a duplicate id (the first one is kept) or an
    id that PubTator cannot hold is warned about and counted, or with `strict` appended to `stop` as a
    ConceptNormError that ends the input. Both engines read their input here, so they annotate the same documents.
    """

    def report(path: Path, line: int, problem: str, kind: str = "malformed") -> None:
        message = Errors.E801.format(path=path, line=line, problem=problem)
        if strict:
            stop.append(ConceptNormError(message))
            return
        setattr(summary, kind, getattr(summary, kind) + 1)
        if summary.malformed + summary.duplicates <= MAX_WARNINGS:
            last = summary.malformed + summary.duplicates == MAX_WARNINGS
            warnings.warn(f"{message} {Errors.E808}" if last else message, stacklevel=3)

    seen: set[str] = set()
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
            yield line, doc_id, text


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
    input_format, output_format = resolve_formats(input_path, output_path, input_format, output_format)
    check_output(output_path)  # before the model loads (seconds to minutes)
    done = read_done_ids(output_path, output_format)
    nlp = model if isinstance(model, Language) else load(model)
    if max_length:
        nlp.max_length = max_length
    limit = nlp.max_length
    summary = Summary()
    # A --strict error or a Ctrl-C ends the input instead of raising inside nlp.pipe: the documents before it
    # are finished and written, and the multiprocessing workers shut down cleanly; it is raised afterwards.
    stop: list[BaseException] = []

    def texts() -> Iterator[tuple[str, tuple[object, int, bool]]]:
        """(text, (id, offset, last piece?)) for nlp.pipe, read lazily as the pipeline asks for more."""
        for _, doc_id, text in input_documents(input_path, input_format, output_format, done, summary, strict, stop):
            pieces = split_text(text, limit)
            if len(pieces) > 1:
                message = Errors.E809.format(id=doc_id, length=len(text), limit=limit, pieces=len(pieces))
                warnings.warn(message, stacklevel=2)
            for i, (offset, piece) in enumerate(pieces, 1):
                yield piece, (doc_id, offset, i == len(pieces))

    workers_before, annotating = set(multiprocessing.active_children()), os.getpid()

    def worker_failed(name: object, proc: object, docs: object, error: Exception) -> None:
        """spaCy's handler of a worker's exception (n_process > 1): its workers are ended before it waits for
        them, which would block on their pipes, and the run stops with the documents before it written. (Inside
        a worker, spaCy hands a function component's exception to the same handler: it goes to the parent.)"""
        if os.getpid() != annotating:
            raise error
        for child in set(multiprocessing.active_children()) - workers_before:
            child.terminate()
        detail = next((line for line in reversed(str(error).splitlines()) if line.strip()), repr(error))
        raise ConceptNormError(Errors.E987.format(detail=detail.strip(), path=output_path)) from error

    def documents() -> Iterator[tuple[object, str, list[dict]]]:
        """(id, text, entity records), the pieces of a long text put back together (nlp.pipe keeps the order)."""
        pieces, entities = [], []
        handler = nlp.default_error_handler
        if n_process > 1:
            nlp.default_error_handler = worker_failed
        try:
            with workers_die_with_parent() if n_process > 1 else nullcontext():
                for doc, (doc_id, offset, last) in nlp.pipe(
                    texts(), as_tuples=True, n_process=n_process, batch_size=batch_size
                ):
                    pieces.append(doc.text)
                    entities.extend(entity_record(ent, offset) for ent in doc.ents)
                    if last:
                        yield doc_id, "".join(pieces), entities
                        pieces, entities = [], []
        finally:
            nlp.default_error_handler = handler

    write_record = WRITERS[output_format]
    output_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # unbuffered: bytes that failed to be written are not kept to fail again when the file is flushed or closed
    with (
        open(output_path, "ab", buffering=0) as f,
        tqdm(desc="annotate", unit="doc", disable=not progress, dynamic_ncols=True) as bar,
        stop_on_sigint(stop),
    ):
        batch: list[str] = []
        writing = False  # true while a write may be half done: nothing may follow it then

        def flush() -> None:
            nonlocal writing
            writing = True
            data = memoryview("".join(batch).encode("utf-8"))
            try:
                while data:  # an unbuffered write may write part of the bytes
                    data = data[f.write(data) :]
            except OSError as e:  # a full disk or a file-size limit: the records before this batch stay
                raise ConceptNormError(Errors.E986.format(path=output_path, detail=e.strerror or e)) from None
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
            os.fsync(f.fileno())
            summary.seconds = time.perf_counter() - start
    if stop:
        raise stop[0]
    return summary
