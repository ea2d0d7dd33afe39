"""What the curation server reads and writes: the `annotate` JSONL it reviews, the reviews log it appends to, and
the synonyms file it rewrites.

- Reviews (`ReviewLog`): one decision a line, each appended with a single `os.write` of the whole line followed by
  `fsync`, so a crash loses at most the line being written. A torn last line (the server killed mid-write) is
  cut off with a warning when the file is opened again, before anything is appended after it.
- Synonyms (`write_synonyms`): the (text, concept_id) pairs in force, one JSON object a line, rewritten whole and
  atomically (`io.files.atomic_open`) after every change; `read_synonyms` + `add_synonyms` apply them to a pipeline.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from spacy.language import Language

from ..annotate import READERS, detect_input_format
from ..errors import ConceptNormError, Errors, Warnings
from ..io.files import atomic_open, read_lines


@dataclass
class Mention:
    """One linked entity of an `annotate` record, as it was written (`annotate.entity_record`).

    doc (int): Index of its document in `Annotations.documents`.
    start (int): Character offset of the mention in its document.
    end (int): Character offset of its end.
    text (str): The mention.
    label (str): Its entity label.
    concept_id (str): The linked id ("NIL" for no link; parts of a composite joined by "|").
    score (Optional[float]): The best candidate's score.
    confidence (Optional[float]): `kb_confidence`, the probability that the link is right.
    name (Optional[str]): The name that matched.
    stage (Optional[str]): The sieve stage that answered.
    parts (List[dict]): The parts of a composite (empty otherwise).
    assertion (Optional[str]): Its assertion status (negated, family, ..., affirmed) where the pipeline ends with
        `clinical_context`.
    """

    doc: int
    start: int
    end: int
    text: str
    label: str
    concept_id: str
    score: float | None = None
    confidence: float | None = None
    name: str | None = None
    stage: str | None = None
    parts: list[dict] = field(default_factory=list)
    assertion: str | None = None


@dataclass
class Annotations:
    """The documents (id and text, "" when the output holds no text) and their mentions, in file order."""

    doc_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mention(doc: int, entity: dict) -> Mention:
    start, end, text = entity["start"], entity["end"], entity["text"]
    if not (isinstance(start, int) and isinstance(end, int) and isinstance(text, str)):
        raise TypeError("start, end and text must be two integers and a string")
    parts, assertion = entity.get("parts") or [], entity.get("assertion")
    return Mention(
        doc, start, end, text, str(entity.get("label") or ""), str(entity.get("concept_id") or "NIL"),
        _number(entity.get("score")), _number(entity.get("confidence")), entity.get("name"), entity.get("stage"),
        [p for p in parts if isinstance(p, dict)], assertion if isinstance(assertion, str) else None,
    )  # fmt: skip


def read_annotations(path: str | Path, documents: str | Path | None = None) -> Annotations:
    """Read an `annotate` JSONL output. A torn last line (a run still writing, or killed) is skipped with a
    warning; any other bad line raises ConceptNormError naming it.

    path (Union[str, Path]): The JSONL output of `annotate`.
    documents (Optional[Union[str, Path]]): The `annotate` input (JSONL, PubTator or .txt), for the texts when
        the output was written without `--include-text`.
    RETURNS (Annotations): Documents and mentions.
    """
    path = Path(path)
    lines = list(read_lines(path))
    out = Annotations()
    for n, (lineno, line) in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            entities = record["entities"]
            if not isinstance(entities, list):
                raise TypeError("'entities' is not a list")
            mentions = [_mention(len(out.doc_ids), e) for e in entities]
        except (ValueError, KeyError, TypeError) as e:
            if n == len(lines) - 1 and not path.read_bytes().endswith(b"\n"):
                warnings.warn(Warnings.W970.format(path=path, line=lineno), stacklevel=2)
                break
            detail = f"{type(e).__name__}: {e}"
            raise ConceptNormError(Errors.E971.format(path=path, line=lineno, detail=detail)) from None
        out.doc_ids.append(str(record.get("id")))
        out.texts.append(record.get("text") if isinstance(record.get("text"), str) else "")
        out.mentions.extend(mentions)
    if documents is not None:
        _add_texts(out, Path(documents))
    return out


def _add_texts(out: Annotations, path: Path) -> None:
    """Fill in the texts of the documents from the `annotate` input they were read from."""

    def skip(file: Path, line: int, problem: str) -> None:
        """Input records `annotate` skipped have no output to show."""

    if not path.exists():
        raise ConceptNormError(Errors.E804.format(path=path))
    position = {doc_id: i for i, doc_id in enumerate(out.doc_ids)}
    for _, doc_id, text in READERS[detect_input_format(path)](path, skip):
        i = position.get(str(doc_id))
        if i is not None and not out.texts[i]:
            out.texts[i] = text


class ReviewLog:
    """The reviews JSONL: every decision, in order, one JSON object a line.

    path (Union[str, Path]): The file; created on the first append.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.events: list[dict] = self._load()

    def _load(self) -> list[dict]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # killed mid-write: cut the torn line off before appending after it
            line = data.count(b"\n", 0, complete) + 1
            warnings.warn(Warnings.W971.format(path=self.path, line=line, size=len(data) - complete), stacklevel=3)
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
        events = []
        for lineno, line in enumerate(data[:complete].splitlines(), 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line.decode("utf-8"))
                if not isinstance(event, dict) or not isinstance(event.get("seq"), int):
                    raise TypeError("not an object with an integer 'seq'")
            except (ValueError, TypeError) as e:
                raise ConceptNormError(Errors.E972.format(path=self.path, line=lineno, detail=e)) from None
            events.append(event)
        return events

    @property
    def next_seq(self) -> int:
        return self.events[-1]["seq"] + 1 if self.events else 1

    def append(self, event: dict) -> dict:
        """Write one event as one line (a single write, then fsync) and keep it in `events`.

        event (dict): The decision (JSON-serializable); its `seq` is set here.
        RETURNS (dict): The event as written.
        """
        event = {"seq": self.next_seq, **event}
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a regular file takes the whole line unless the disk is full
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:  # make the new directory entry durable too
            _fsync_dir(self.path.parent)
        self.events.append(event)
        return event


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synonyms(path: str | Path, pairs: Iterable[tuple[str, str]]) -> None:
    """Rewrite the synonyms file atomically: one {"text": ..., "concept_id": ...} object a line."""
    with atomic_open(path, "w") as f:
        f.writelines(json.dumps({"text": t, "concept_id": c}, ensure_ascii=False) + "\n" for t, c in pairs)


def read_synonyms(path: str | Path) -> Iterator[tuple[str, str]]:
    """The (text, concept_id) pairs of a synonyms file written by `write_synonyms`."""
    for lineno, line in read_lines(path):
        if line.strip():
            try:
                obj = json.loads(line)
                yield str(obj["text"]), str(obj["concept_id"])
            except (ValueError, KeyError, TypeError) as e:
                raise ConceptNormError(Errors.E972.format(path=path, line=lineno, detail=e)) from None


def apply_synonyms(nlp: Language, path: str | Path, name: str = "concept_normalizer") -> list[str]:
    """Add the synonyms of a file written by the curation server to a loaded pipeline's linker.

    nlp (Language): The pipeline (`spacy.load`).
    path (Union[str, Path]): The synonyms file.
    name (str): The concept_normalizer's name in the pipeline.
    RETURNS (List[str]): Concept ids not in the pipeline's knowledge base (those pairs were skipped).
    """
    return nlp.get_pipe(name).add_synonyms(list(read_synonyms(path)))
