"""`benchmark speed`: cold linking speed against brute-force TF-IDF in one process, and where the time goes.

    python -m spacy_conceptnorm benchmark speed PIPELINE DATA [--passes 5]

DATA is a file of documents: a `.spacy` DocBin (or a directory of them) or a PubTator file, whose entities are the
mentions (gold mentions), or the inputs of `annotate`, JSONL (`{"id": ..., "text": ...}` a line) or plain text
(a document a line; a directory: a document per .txt file), whose mentions are those the pipeline's components
before its linking pipes find (recognized mentions, marked once before the clock starts).

The mentions go through the pipeline's linking pipes (abbreviation_resolver -> composite_splitter ->
concept_normalizer, those of them it has) with the concept_normalizer's cache off, so every pass is cold; the docs
are made before the clock starts. In the same process and the same passes, taking turns, a brute-force nearest
name by scikit-learn's character 3-gram TF-IDF (`TfidfVectorizer(analyzer="char", ngram_range=(3, 3))`) over the
same knowledge-base names links the same mention texts, in batches of `--tfidf-batch` mentions (fitting not
timed; the batch's scores made dense before the argmax, 2x faster than scikit-learn's sparse argmax, which is
timed too and reported beside it: `ratio` is against the faster of the two).
One untimed pass of each comes first (it loads the encoder's weights).

Each pass also makes a third, instrumented pass of the pipeline, with timers around each pipe's generator, the
encoder's calls (`NameEncoder.encode`, `encode_queries`) and the vector index's searches (`VectorIndex.search`):
the cold pass's time split into the text components, encoding, index search, the rest of the concept_normalizer
(candidates, ranking, confidence), and spaCy's own share (`nlp.pipe` outside the pipes). The whole pipeline's
documents/s, the recognizer included, is `benchmark throughput`'s.

The encoding's floor, timed in each pass too: the texts that a cold pass encodes (`NameEncoder.encode_queries`,
recorded once), encoded by `NameEncoder.encode` in batches sorted by length and padded to each batch's longest,
without the fixed shapes that make a mention's vector independent of its company: the least this encoder
computes for them. `encoding/floor` is the cold pass's encoding time over it.

Medians over the passes; the last line is `ratio X`: the pipeline's mentions/s over TF-IDF's. docs/benchmarks.md
has the figures of the shipped pipeline on NCBI-disease test.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ._util import benchmark_cli

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

LINKING_PIPES = ("abbreviation_resolver", "composite_splitter", "concept_normalizer")  # factories
SPACY_SHARE = "spaCy (nlp.pipe less the pipes)"  # the part of a pass that no pipe's generator spends


class TfidfLinker:
    """The nearest name by cosine of character 3-gram TF-IDF vectors, by brute force over every name.

    names (list[str]): The names to search.
    batch (int): Mentions per sparse product.
    """

    def __init__(self, names: list[str], batch: int = 64) -> None:
        import numpy as np
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.names = names
        self.batch = batch
        self.vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(3, 3), dtype=np.float32)
        self.matrix_t = self.vectorizer.fit_transform(names).T.tocsr()

    def link(self, texts: list[str], dense: bool = True) -> list[str]:
        """The nearest name of each text; `dense`: each batch's scores made dense before the argmax (faster), else
        the sparse matrix's argmax."""
        import numpy as np

        nearest = []
        for start in range(0, len(texts), self.batch):
            scores = self.vectorizer.transform(texts[start : start + self.batch]) @ self.matrix_t
            best = scores.toarray().argmax(axis=1) if dense else np.asarray(scores.argmax(axis=1)).ravel()
            nearest.extend(best.tolist())
        return [self.names[i] for i in nearest]


def timed_methods() -> dict[str, list[tuple[type, str]]]:
    """The methods whose time the split reports apart, by label."""
    from ..ml.name_encoder import NameEncoder
    from ..search.index import VectorIndex

    return {
        "encoding": [(NameEncoder, "encode"), (NameEncoder, "encode_queries")],
        "index search": [(VectorIndex, "search")],
    }


@contextmanager
def timers(seconds: dict[str, float]) -> Iterator[None]:
    """Add the time spent in the `timed_methods` to `seconds` (outermost calls only) while the block runs."""
    depth: dict[str, int] = defaultdict(int)
    originals = []

    def timed(label: str, method: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            depth[label] += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                depth[label] -= 1
                if not depth[label]:
                    seconds[label] += time.perf_counter() - start

        return wrapper

    for label, methods in timed_methods().items():
        for cls, name in methods:
            originals.append((cls, name, getattr(cls, name)))
            setattr(cls, name, timed(label, getattr(cls, name)))
    try:
        yield
    finally:
        for cls, name, method in originals:
            setattr(cls, name, method)


def pipe_split(nlp: Language, docs: Iterable[Doc], batch_size: int | None = None) -> dict[str, float]:
    """Seconds of one `nlp.pipe` pass over `docs`, by pipe, and spaCy's own (`SPACY_SHARE`).

    Each pipe's generator is timed while it makes its next doc, which includes the pipes before it (it pulls its
    docs from theirs): a pipe's own time is its time less theirs, and spaCy's is the pass's less the last pipe's, so
    the values add up to the pass's time. A pipe whose `pipe` cannot be wrapped (an extension type, such as spaCy's
    `ner`) is timed through the stream that the next pipe reads, or that `nlp.pipe` gives when it is the last; two
    such pipes in a row make one row, "a + b".

    nlp (Language): The pipeline, with the pipes to time enabled.
    docs (Iterable[Doc]): The documents, made before the call (making them is not timed).
    batch_size (Optional[int]): `nlp.pipe`'s batch size; None: the pipeline's.
    RETURNS (dict[str, float]): Seconds by pipe name in the pipeline's order, then SPACY_SHARE.
    """
    names = nlp.pipe_names
    inclusive = [0.0] * (len(names) + 1)  # [i]: the time spent making the docs that leave the i-th pipe
    observed = [True] + [False] * len(names)  # [0]: the docs given, made before

    def timed(stream: Iterator[Doc], after: int) -> Iterator[Doc]:
        while True:
            start = time.perf_counter()
            doc = next(stream, None)
            inclusive[after] += time.perf_counter() - start
            if doc is None:
                return
            yield doc

    def timed_pipe(i: int, pipe: Callable, input_too: bool) -> Callable:
        def wrapper(stream: Iterable[Doc], **kwargs) -> Iterator[Doc]:
            if input_too:  # the pipe before cannot be wrapped: time the docs it hands on here
                stream = timed(iter(stream), i - 1)
            return timed(iter(pipe(stream, **kwargs)), i)

        return wrapper

    def own_pipe(proc: Callable) -> Callable:
        if hasattr(type(proc), "pipe"):
            return type(proc).pipe.__get__(proc)
        return lambda stream, **_: (proc(doc) for doc in stream)  # a function component

    wrapped = []
    for i, (_, proc) in enumerate(nlp.pipeline, 1):
        try:
            proc.pipe = timed_pipe(i, own_pipe(proc), not observed[i - 1])
        except AttributeError:  # read-only
            continue
        wrapped.append(proc)
        observed[i - 1] = observed[i] = True
    last_wrapped, observed[-1] = observed[-1], True  # else the docs that `nlp.pipe` gives time the last pipe
    try:
        start = time.perf_counter()
        made = nlp.pipe(docs, batch_size=batch_size)
        list(made if last_wrapped else timed(made, len(names)))
        total = time.perf_counter() - start
    finally:
        for proc in wrapped:
            del proc.pipe
    seconds, last = {}, 0
    for i in range(1, len(names) + 1):
        if observed[i]:
            seconds[" + ".join(names[last:i])] = inclusive[i] - inclusive[last]
            last = i
    seconds[SPACY_SHARE] = total - inclusive[-1]
    return seconds


def linking_split(nlp: Language, docs: list[Doc], normalizer: str) -> dict[str, float]:
    """Seconds per part of one cold `nlp.pipe` pass (see the module docstring): `pipe_split`'s, with the
    concept_normalizer's encoding and index search reported apart from the rest of its time.

    nlp (Language): The pipeline, with its linking pipes enabled.
    docs (list[Doc]): The documents, their mentions marked.
    normalizer (str): The name of the concept_normalizer.
    """
    apart = dict.fromkeys(timed_methods(), 0.0)
    with timers(apart):
        split = pipe_split(nlp, docs)
    spacy_share = split.pop(SPACY_SHARE)
    rest = split.pop(normalizer) - sum(apart.values())
    return {
        **apart,
        **split,
        f"{normalizer}: the rest (candidates, ranking, confidence)": rest,
        SPACY_SHARE: spacy_share,
    }


def encoded_queries(nlp: Language, docs: list[Doc]) -> list[str]:
    """The texts that one cold `nlp.pipe` pass over `docs` encodes with `NameEncoder.encode_queries`."""
    from ..ml.name_encoder import NameEncoder

    texts: list[str] = []
    original = NameEncoder.encode_queries

    def recording(self, batch):
        texts.extend(batch)
        return original(self, batch)

    NameEncoder.encode_queries = recording
    try:
        list(nlp.pipe(docs))
    finally:
        NameEncoder.encode_queries = original
    return texts


def read_documents(nlp: Language, path: Path) -> list[Doc]:
    """The documents of `path` (see the module docstring), with their entities where the file has some: a `.spacy`
    DocBin, a directory of them or a PubTator file read by `io.corpus.read_docs`; JSONL and plain text by the
    readers of `annotate`, a malformed record reported on stderr and skipped."""
    from ..annotate import READERS, detect_input_format
    from ..io.corpus import read_docs

    if path.suffix == ".spacy" or (path.is_dir() and any(path.glob("*.spacy"))):
        return list(read_docs(path, nlp))
    input_format = detect_input_format(path)
    if input_format == "pubtator":
        return list(read_docs(path, nlp))

    def report(file: Path, lineno: int, problem: str) -> None:
        typer.echo(f"{file}:{lineno}: {problem}: skipped", err=True)

    return [nlp.make_doc(text) for _, _, text in READERS[input_format](path, report)]


def mark_mentions(nlp: Language, docs: list[Doc], linking: list[str]) -> list[Doc]:
    """The docs with the entities that the pipeline's components before its first linking pipe (the recognizers
    and what they read) find."""
    finders = nlp.pipe_names[: nlp.pipe_names.index(linking[0])]
    with nlp.select_pipes(enable=finders):
        return list(nlp.pipe(docs))


@benchmark_cli.command("speed")
def benchmark_speed(
    pipeline: str = typer.Argument(..., help="Pipeline directory or package with a concept_normalizer"),
    data: Path = typer.Argument(..., help="Documents: .spacy, PubTator, JSONL or plain text", exists=True),
    passes: int = typer.Option(5, min=1, help="Timed passes of each linker, taking turns"),
    tfidf_batch: int = typer.Option(64, min=1, help="Mentions per TF-IDF sparse product"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    """Cold linking speed against brute-force TF-IDF, and where the time goes.

    The mentions are DATA's entities, else those the pipeline's recognizers find. The last line is `ratio X`: the
    pipeline's mentions/s over TF-IDF's over the same KB names (docs/benchmarks.md).
    """
    from ..errors import ConceptNormError
    from ..evaluation.gold import get_normalizer, strip_links
    from ..io.files import write_json
    from ..io.pipelines import load
    from .benchmark_weight import machine

    try:
        nlp = load(pipeline)
        normalizer_name, normalizer = get_normalizer(nlp, pipeline)
        documents = read_documents(nlp, data)
    except (ConceptNormError, OSError) as e:  # OSError: spaCy's E050, no pipeline there
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    normalizer.cache_size = 0
    linking = [name for name in nlp.pipe_names if nlp.get_pipe_meta(name).factory in LINKING_PIPES]
    kind = "gold"
    if not any(doc.ents for doc in documents):
        documents, kind = mark_mentions(nlp, documents, linking), "recognized"
    mentions = [ent.text for doc in documents for ent in doc.ents]
    if not mentions:
        typer.echo(f"Error: no mentions in {data}, nor any that the pipeline's recognizers find.", err=True)
        raise typer.Exit(1)
    names = normalizer.kb.names()
    tfidf = TfidfLinker(names, tfidf_batch)
    figures: dict = {
        "machine": machine(),
        "pipeline": str(pipeline),
        "data": str(data),
        "docs": len(documents),
        "mentions": len(mentions),
        "mentions_from": kind,
        "names": len(names),
        "linking_pipes": linking,
        "passes": [],
    }
    with nlp.select_pipes(enable=linking):
        list(nlp.pipe(strip_links(documents)))  # untimed: loads the encoder's weights
        queries = encoded_queries(nlp, strip_links(documents))
        encoder = normalizer.encoder
        encoder.encode(queries)  # untimed, as the passes before
        tfidf.link(mentions)
        tfidf.link(mentions, dense=False)
        for _ in range(passes):
            run = {"load_before": os.getloadavg()[0]}
            docs = strip_links(documents)
            start = time.perf_counter()
            list(nlp.pipe(docs))
            run["pipeline_seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            tfidf.link(mentions)
            run["tfidf_seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            tfidf.link(mentions, dense=False)
            run["tfidf_sparse_argmax_seconds"] = time.perf_counter() - start
            run["split"] = linking_split(nlp, strip_links(documents), normalizer_name)
            start = time.perf_counter()
            encoder.encode(queries)
            run["encoding_floor_seconds"] = time.perf_counter() - start
            figures["passes"].append(run)
    ours = statistics.median(run["pipeline_seconds"] for run in figures["passes"])
    theirs = statistics.median(run["tfidf_seconds"] for run in figures["passes"])
    theirs_sparse = statistics.median(run["tfidf_sparse_argmax_seconds"] for run in figures["passes"])
    parts = list(figures["passes"][0]["split"])
    split = {part: statistics.median(run["split"][part] for run in figures["passes"]) for part in parts}
    floor = statistics.median(run["encoding_floor_seconds"] for run in figures["passes"])
    tokenized = encoder.tokenizer(queries, truncation=True, max_length=encoder.max_length) if queries else None
    pieces = sum(map(len, tokenized["input_ids"])) if tokenized else 0
    figures.update(
        pipeline_mentions_per_second=len(mentions) / ours,
        tfidf_mentions_per_second=len(mentions) / theirs,
        tfidf_sparse_argmax_mentions_per_second=len(mentions) / theirs_sparse,
        ratio_sparse_argmax=theirs_sparse / ours,
        split_seconds=split,
        encoded_texts=len(queries),
        encoded_word_pieces=pieces,
        encoding_floor_seconds=floor,
        encoding_over_floor=split["encoding"] / floor if floor else None,
        ratio=theirs / ours,
    )
    figures["load_average_after"] = os.getloadavg()[0]

    typer.echo(
        f"{pipeline}: {len(documents)} docs, {len(mentions)} {kind} mentions, {len(names):,} KB names; "
        f"{passes} passes; {figures['machine']}"
    )
    loads = [run["load_before"] for run in figures["passes"]] + [figures["load_average_after"]]
    typer.echo(f"load average during the passes: {min(loads):.2f}-{max(loads):.2f}")
    typer.echo(f"\ncold pass, {' -> '.join(linking)}, cache off: where the time goes (median seconds)")
    typer.echo("| part | seconds | share |")
    typer.echo("|---|---|---|")
    for part, value in split.items():
        typer.echo(f"| {part} | {value:.3f} | {100 * value / sum(split.values()):.0f}% |")
    if queries:
        typer.echo(
            f"\nencoding {len(queries)} texts ({pieces:,} word pieces): {split['encoding']:.3f} s; floor (the same "
            f"texts by NameEncoder.encode, length-sorted batches) {floor:.3f} s; encoding/floor "
            f"{figures['encoding_over_floor']:.2f}"
        )
    typer.echo(
        f"\npipeline: {figures['pipeline_mentions_per_second']:,.0f} mentions/s; "
        f"TF-IDF (char 3-grams, brute force): {figures['tfidf_mentions_per_second']:,.0f} mentions/s "
        f"(with scikit-learn's sparse argmax: {figures['tfidf_sparse_argmax_mentions_per_second']:,.0f}, "
        f"ratio {figures['ratio_sparse_argmax']:.2f})"
    )
    if output:
        write_json(output, figures)
    typer.echo(f"ratio {figures['ratio']:.2f}")
