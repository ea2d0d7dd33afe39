"""`annotate --engine ray`: the documents of INPUT annotated by Ray Data actors, on this machine or a Ray cluster.

The driver (this process) reads INPUT with the local engine's readers (`run.input_documents`: the same ids, the same
malformed-line and duplicate handling, the ids OUTPUT already holds skipped) and cuts the documents still to do into
shards of `shard_size`, in input order. Each shard is put into Ray's object store as one Arrow block; `map_batches`
sends the blocks to a pool of `ShardAnnotator` actors, each of which loads the pipeline once and turns documents into
output records (a JSONL line or a PubTator block, written by the same `writers` as the local engine). The driver
writes each finished shard to `OUTPUT.parts/part-NNNNN.<ext>` (atomically) and then records it in
`OUTPUT.parts/manifest.json` (rewritten atomically): its document count, the SHA-256 of its ids and the file's size.

A re-run reads the input again, cuts the same shards and skips those the manifest lists with the same ids and a
part file of the recorded size: a shard is redone whole or not at all, so nothing is lost and nothing written
twice. When every shard is done, OUTPUT's previous content and the part files, in shard order, are written into
OUTPUT atomically, then OUTPUT.parts is removed. OUTPUT ends with the same records, in the same order, as the local
engine writes.

The pipeline is loaded by every actor with `io.pipelines.load(model)` (`spacy.load`, every file checked): on a
cluster MODEL must be a path present on every node (or an installed package), and so must spacy_conceptnorm and
any code the pipeline's config names. INPUT and
OUTPUT are only read and written by the driver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spacy
from tqdm import tqdm

from ..errors import ConceptNormError, Errors, Warnings
from ..io.files import atomic_open, write_json
from ..io.pipelines import load
from .resume import check_output, read_done_ids
from .run import Summary, input_documents, resolve_formats, split_text
from .writers import WRITERS, entity_record

MANIFEST_FORMAT = 1
EXTENSIONS = {"jsonl": ".jsonl", "pubtator": ".pubtator"}


@dataclass
class RaySummary(Summary):
    shards: int = 0  # shards of this run's documents
    shards_done_before: int = 0  # of which an earlier run had finished
    actors: int = 0

    def __str__(self) -> str:
        return (
            f"{super().__str__()}, {self.shards} shards ({self.shards_done_before} finished by an earlier run), "
            f"{self.actors} Ray actors"
        )


def parts_dir(output_path: Path) -> Path:
    """Where the shards of OUTPUT are kept until they are merged into it: OUTPUT.parts beside it."""
    return output_path.with_name(output_path.name + ".parts")


def ids_digest(ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for doc_id in ids:
        digest.update(doc_id.encode("utf-8") + b"\0")
    return digest.hexdigest()


class ShardAnnotator:
    """The Ray actor of `map_batches`: loads the pipeline once, then turns shards of documents (Arrow tables with
    the columns shard, seq, id (JSON) and text) into records (shard, seq, record, entities, warning: E809 for a
    text annotated in pieces, warned about by the driver).

    model (str): A saved pipeline directory (on this node) or an installed pipeline package.
    output_format (str): "jsonl" or "pubtator".
    include_text (bool): Write each document's text in the JSONL records.
    batch_size (int): Documents (or pieces of a long document) per `nlp.pipe` batch.
    max_length (Optional[int]): Characters per spaCy doc, longer texts are annotated in pieces (as the local
        engine); default: the pipeline's `nlp.max_length`.
    use_gpu (bool): Call `spacy.prefer_gpu()` before loading (the actor was given a GPU).
    """

    def __init__(
        self, model: str, output_format: str, include_text: bool, batch_size: int, max_length: int | None, use_gpu: bool
    ) -> None:
        if use_gpu:
            spacy.prefer_gpu()
        self.nlp = load(model)
        if max_length:
            self.nlp.max_length = max_length
        self.write_record = WRITERS[output_format]
        self.include_text = include_text
        self.batch_size = batch_size

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        ids = [json.loads(doc_id) for doc_id in batch.column("id").to_pylist()]
        texts = batch.column("text").to_pylist()
        limit = self.nlp.max_length
        found_warnings = [""] * len(texts)

        def pieces() -> Iterator[tuple[str, tuple[int, int, bool]]]:
            for row, text in enumerate(texts):
                cut = split_text(text, limit)
                if len(cut) > 1:
                    found_warnings[row] = Errors.E809.format(
                        id=ids[row], length=len(text), limit=limit, pieces=len(cut)
                    )
                for i, (offset, piece) in enumerate(cut, 1):
                    yield piece, (row, offset, i == len(cut))

        records, counts, entities = [], [], []
        for doc, (row, offset, last) in self.nlp.pipe(pieces(), as_tuples=True, batch_size=self.batch_size):
            entities.extend(entity_record(ent, offset) for ent in doc.ents)
            if last:
                records.append(self.write_record(ids[row], texts[row], entities, self.include_text))
                counts.append(len(entities))
                entities = []
        return pa.table(
            {
                "shard": batch.column("shard"),
                "seq": batch.column("seq"),
                "record": pa.array(records, pa.large_string()),
                "entities": pa.array(counts, pa.int64()),
                "warning": pa.array(found_warnings, pa.string()),
            }
        )


class Manifest:
    """OUTPUT.parts/manifest.json: the run's settings and the finished shards, rewritten atomically."""

    def __init__(self, directory: Path, settings: dict) -> None:
        self.directory, self.path, self.settings = directory, directory / "manifest.json", settings
        self.shards: dict[str, dict] = {}
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            saved = {key: data[key] for key in settings}
            shards = data["shards"]
            valid = data.get("format") == MANIFEST_FORMAT and isinstance(shards, dict)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ConceptNormError(Errors.E991.format(path=self.path, detail=f"{type(e).__name__}: {e}")) from None
        if not valid:
            raise ConceptNormError(Errors.E991.format(path=self.path, detail="not a manifest of this version"))
        if saved != settings:
            changed = ", ".join(f"{k} {saved[k]!r} -> {v!r}" for k, v in settings.items() if saved[k] != v)
            warnings.warn(Warnings.W990.format(path=self.path, changed=changed), stacklevel=3)
            return
        self.shards = shards

    def is_done(self, index: int, file: str, digest: str, count: int) -> bool:
        """Whether shard `index` was finished with these documents: listed with the same file, ids and count, and
        its part file has the recorded size."""
        entry = self.shards.get(str(index))
        listed = (entry.get("file"), entry.get("ids_sha256"), entry.get("documents")) if isinstance(entry, dict) else ()
        if listed != (file, digest, count):
            return False
        part = self.directory / file
        return part.is_file() and part.stat().st_size == entry.get("bytes")

    def add(self, index: int, entry: dict) -> None:
        self.shards[str(index)] = entry
        write_json(self.path, {"format": MANIFEST_FORMAT, **self.settings, "shards": self.shards})


@dataclass
class Shard:
    index: int
    count: int
    digest: str
    file: str
    done: bool
    ref: Any = None  # the object-store reference of its documents (an Arrow table), when not done


def check_reachable(address: str) -> None:
    """Raise ConceptNormError (E993) if a "host:port" or "ray://host:port" address does not accept a connection
    within 10 s: `ray.init` would wait for it for ever. Other addresses ("auto", "local") are Ray's to resolve."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ConceptNormError(Errors.E993.format(address=address, detail=e.strerror or e)) from None


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray connected: an instance already initialised in this process is used as it is; else `ray.init(address)`
    (None: RAY_ADDRESS, else a new local instance), shut down at the end."""
    import ray

    if ray.is_initialized():
        yield
        return
    if address:
        check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    except ConnectionError as e:
        raise ConceptNormError(Errors.E993.format(address=address, detail=e)) from None
    try:
        yield
    finally:
        ray.shutdown()


def annotate_ray(
    model: str | Path,
    input_path: str | Path,
    output_path: str | Path,
    *,
    address: str | None = None,
    concurrency: int | None = None,
    num_gpus: float = 0.0,
    shard_size: int = 1000,
    batch_size: int = 64,
    input_format: str = "auto",
    output_format: str = "auto",
    strict: bool = False,
    include_text: bool = False,
    progress: bool = True,
    max_length: int | None = None,
) -> RaySummary:
    """Annotate every document of INPUT on Ray and merge the results into OUTPUT, resuming a previous run (of
    either engine): ids already in OUTPUT are skipped, and so are the shards an interrupted run finished.

    model (Union[str, Path]): A saved pipeline directory (reachable at that path on every node) or package name.
    input_path (Union[str, Path]): A .jsonl, PubTator or .txt file, or a directory of .txt files (read here).
    output_path (Union[str, Path]): The .jsonl or .pubtator file to write; the shards wait in OUTPUT.parts.
    address (Optional[str]): The Ray cluster to join ("auto", "ray://host:10001", "host:6379"); None: RAY_ADDRESS,
        else a new local Ray instance. An instance already initialised in this process is used as it is.
    concurrency (Optional[int]): Actors, each holding one pipeline in memory. Default: the cluster's CPUs, or
        its GPUs divided by `num_gpus`.
    num_gpus (float): GPUs per actor (a fraction shares one GPU); 0 runs on CPU.
    shard_size (int): Documents per shard, the unit of resuming.
    batch_size (int): Documents per `nlp.pipe` batch in an actor.
    input_format, output_format, strict, include_text, max_length: as for the local engine (`annotate`).
    progress (bool): Show a progress bar (documents, updated as shards finish).
    RETURNS (RaySummary): The counts of the run.
    """
    for name, value, minimum in (("shard_size", shard_size, 1), ("batch_size", batch_size, 1)):
        if not isinstance(value, int) or value < minimum:
            raise ConceptNormError(Errors.E992.format(name=name, expected=f"an integer >= {minimum}", value=value))
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise ConceptNormError(Errors.E992.format(name="concurrency", expected="an integer >= 1", value=concurrency))
    if not isinstance(num_gpus, (int, float)) or num_gpus < 0:
        raise ConceptNormError(Errors.E992.format(name="num_gpus", expected="a number >= 0", value=num_gpus))
    try:
        import ray.data  # noqa: F401
    except ImportError:
        raise ConceptNormError(Errors.E990) from None
    input_path, output_path = Path(input_path), Path(output_path)
    input_format, output_format = resolve_formats(input_path, output_path, input_format, output_format)
    check_output(output_path)
    model = str(Path(model).resolve()) if Path(model).exists() else str(model)  # actors may run elsewhere
    done_ids = read_done_ids(output_path, output_format)
    parts = parts_dir(output_path)
    settings = {"output_format": output_format, "include_text": include_text, "shard_size": shard_size}
    manifest = Manifest(parts, settings)
    summary = RaySummary()
    stop: list[BaseException] = []  # a --strict error: the input ends there, the documents before it are written
    start = time.perf_counter()
    with ExitStack() as session:
        connected: list[bool] = []

        def connect() -> None:  # at the first shard to annotate: a run with nothing left to do starts no Ray
            if not connected:
                session.enter_context(ray_session(address))
                connected.append(True)

        documents = input_documents(input_path, input_format, output_format, done_ids, summary, strict, stop)
        shards = read_shards(documents, shard_size, manifest, EXTENSIONS[output_format], connect)
        summary.shards = len(shards)
        summary.shards_done_before = sum(shard.done for shard in shards)
        summary.skipped += sum(shard.count for shard in shards if shard.done)
        todo = [shard for shard in shards if not shard.done]
        if todo:
            options = {"model": model, "output_format": output_format, "include_text": include_text,
                       "batch_size": batch_size, "max_length": max_length, "use_gpu": num_gpus > 0}  # fmt: skip
            run_shards(todo, manifest, summary, options, concurrency, num_gpus, progress)
    merge(output_path, parts, shards)
    summary.seconds = time.perf_counter() - start
    if stop:
        raise stop[0]
    return summary


def read_shards(
    documents: Iterable[tuple[int, object, str]],
    shard_size: int,
    manifest: Manifest,
    extension: str,
    connect: Callable[[], None],
) -> list[Shard]:
    """The documents cut into shards in input order; a shard the manifest lists as finished is only counted, the
    documents of the others are put into Ray's object store (connecting to Ray, by `connect()`, at the first)."""
    import pyarrow as pa
    import ray

    shards: list[Shard] = []
    ids: list[str] = []  # JSON, so that an integer id stays an integer
    texts: list[str] = []

    def close() -> None:
        index = len(shards)
        shard = Shard(index, len(ids), ids_digest(ids), f"part-{index:05d}{extension}", False)
        shard.done = manifest.is_done(index, shard.file, shard.digest, shard.count)
        if not shard.done:
            connect()
            table = {"shard": pa.array([index] * len(ids), pa.int64()), "seq": pa.array(range(len(ids)), pa.int64()),
                     "id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.large_string())}  # fmt: skip
            shard.ref = ray.put(pa.table(table))
        shards.append(shard)
        ids.clear()
        texts.clear()

    for _, doc_id, text in documents:
        ids.append(json.dumps(doc_id, ensure_ascii=False))
        texts.append(text)
        if len(ids) == shard_size:
            close()
    if ids:
        close()
    return shards


def run_shards(
    todo: list[Shard],
    manifest: Manifest,
    summary: RaySummary,
    options: dict,
    concurrency: int | None,
    num_gpus: float,
    progress: bool,
) -> None:
    """Annotate the shards on a pool of `ShardAnnotator` actors; each shard is written (and added to the manifest)
    as soon as its last document comes back."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    if concurrency is None:
        resources = ray.cluster_resources()
        concurrency = int(resources.get("GPU", 0) / num_gpus) if num_gpus else int(resources.get("CPU", 1))
    summary.actors = max(1, min(concurrency, len(todo)))  # more actors than shards would only load pipelines
    context, logger = DataContext.get_current(), logging.getLogger("ray.data")
    bars, level = context.enable_progress_bars, logger.level
    context.enable_progress_bars = False  # ours counts documents
    logger.setLevel(logging.WARNING)  # not the execution plan and statistics of every run
    dataset = ray.data.from_arrow_refs([shard.ref for shard in todo]).map_batches(
        ShardAnnotator,
        fn_constructor_kwargs=options,
        batch_size=None,  # a whole shard per call: one task per shard, which comes back whole
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=summary.actors),
        num_cpus=1,
        num_gpus=num_gpus or None,
    )
    shards = {shard.index: shard for shard in todo}
    arrived: dict[int, list[tuple[int, str, int, str]]] = {}
    total = sum(shard.count for shard in todo)
    try:
        with tqdm(desc="annotate (ray)", unit="doc", total=total, disable=not progress, dynamic_ncols=True) as bar:
            for block in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                columns = [block.column(name).to_pylist() for name in ("shard", "seq", "record", "entities", "warning")]
                for index, *row in zip(*columns):
                    rows = arrived.setdefault(index, [])
                    rows.append(tuple(row))
                    if len(rows) == shards[index].count:
                        write_shard(shards[index], sorted(arrived.pop(index)), manifest, summary)
                        bar.update(shards[index].count)
    except ray.exceptions.RayError as e:
        raise ConceptNormError(Errors.E994.format(detail=first_cause(e), path=manifest.directory)) from None
    finally:
        context.enable_progress_bars = bars
        logger.setLevel(level)
    if arrived or any(not shard.done for shard in todo):
        missing = sorted({shard.index for shard in todo if not shard.done})
        raise ConceptNormError(Errors.E995.format(shards=missing[:10], path=manifest.directory))


ERROR_LINE = re.compile(r"^(?!ray\.)([\w.]+(Error|Exception|Interrupt|Exit)\b.*?:.*)$", re.MULTILINE)


def first_cause(error: BaseException) -> str:
    """The exception an actor raised, from the traceback text Ray gives (its own exceptions wrap it): the first
    line that names an exception not of Ray's, else the last non-blank line."""
    text = str(error)
    found = ERROR_LINE.search(text)
    if not found:
        return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), repr(error))
    line = found[1].strip()
    if line.endswith(":"):  # the message is on the next lines (a spaCy config error, say): two of them
        line += " " + " ".join([rest.strip() for rest in text[found.end() :].splitlines() if rest.strip()][:2])
    return line


def write_shard(shard: Shard, rows: list[tuple[int, str, int, str]], manifest: Manifest, summary: RaySummary) -> None:
    """The part file of a finished shard (atomically), then its manifest entry; warnings of its long texts."""
    if [seq for seq, *_ in rows] != list(range(shard.count)):
        raise ConceptNormError(Errors.E995.format(shards=[shard.index], path=manifest.directory))
    data = "".join(record for _, record, _, _ in rows).encode("utf-8")
    try:
        with atomic_open(manifest.directory / shard.file, "wb") as f:
            f.write(data)
        entities = sum(count for _, _, count, _ in rows)
        manifest.add(shard.index, {"file": shard.file, "documents": shard.count, "ids_sha256": shard.digest,
                                   "entities": entities, "bytes": len(data)})  # fmt: skip
    except OSError as e:
        raise ConceptNormError(Errors.E986.format(path=manifest.directory, detail=e.strerror or e)) from None
    for _, _, _, warning in rows:
        if warning:
            warnings.warn(warning, stacklevel=4)
    shard.done, shard.ref = True, None
    summary.written += shard.count
    summary.entities += entities


def merge(output_path: Path, parts: Path, shards: list[Shard]) -> None:
    """OUTPUT's content, then the part files in shard order, written into OUTPUT atomically; OUTPUT.parts removed.
    Nothing is merged while a shard is missing (an interrupted run: the next one resumes from the parts)."""
    if shards:
        try:
            with atomic_open(output_path, "wb") as out:
                with open(output_path, "rb") as previous:
                    shutil.copyfileobj(previous, out)
                for shard in shards:
                    with open(parts / shard.file, "rb") as part:
                        shutil.copyfileobj(part, out)
        except OSError as e:
            raise ConceptNormError(Errors.E986.format(path=output_path, detail=e.strerror or e)) from None
    if parts.is_dir():  # also the parts left by a run killed between this merge and the removal
        shutil.rmtree(parts)
