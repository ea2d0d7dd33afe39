"""Cold linking speed against brute-force TF-IDF in one process, where the time goes, and end-to-end documents/s.

    python -m benchmarks.speed PIPELINE [--test corpus/test.spacy] [--passes 5]

The gold mentions of the test docs (`--test`, by default `corpus/test.spacy` beside the pipeline's directory; a
PubTator file works too) go through the pipeline's linking pipes (abbreviation_resolver -> composite_splitter ->
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
(candidates, ranking, confidence), and spaCy's own share (`nlp.pipe` outside the pipes). Then the test abstracts'
texts go through the whole pipeline, the recognizer included (`--end-to-end-passes`, cache off): documents/s.

Medians over the passes; the last line is `ratio X`: the pipeline's mentions/s over TF-IDF's.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import spacy
import typer
from spacy_conceptnorm.search.index import VectorIndex

from spacy_conceptnorm.io.corpus import read_docs, strip_links
from spacy_conceptnorm.io.files import write_json
from spacy_conceptnorm.ml.name_encoder import NameEncoder

from .weight import machine

app = typer.Typer(add_completion=False)

LINKING_PIPES = ("abbreviation_resolver", "composite_splitter", "concept_normalizer")
TIMED = {
    "encoding": [(NameEncoder, "encode"), (NameEncoder, "encode_queries")],
    "index search": [(VectorIndex, "search")],
}


class TfidfLinker:
    """The nearest name by cosine of character 3-gram TF-IDF vectors, by brute force over every name.

    names (list[str]): The names to search.
    batch (int): Mentions per sparse product.
    """

    def __init__(self, names: list[str], batch: int = 64) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.names = names
        self.batch = batch
        self.vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(3, 3), dtype=np.float32)
        self.matrix_t = self.vectorizer.fit_transform(names).T.tocsr()

    def link(self, texts: list[str], dense: bool = True) -> list[str]:
        """The nearest name of each text; `dense`: each batch's scores made dense before the argmax (faster), else
        the sparse matrix's argmax."""
        nearest = []
        for start in range(0, len(texts), self.batch):
            scores = self.vectorizer.transform(texts[start : start + self.batch]) @ self.matrix_t
            best = scores.toarray().argmax(axis=1) if dense else np.asarray(scores.argmax(axis=1)).ravel()
            nearest.extend(best.tolist())
        return [self.names[i] for i in nearest]


@contextmanager
def timers(seconds: dict[str, float]) -> Iterator[None]:
    """Add the time spent in the TIMED methods to `seconds` (outermost calls only) while the block runs."""
    depth = defaultdict(int)
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

    for label, methods in TIMED.items():
        for cls, name in methods:
            originals.append((cls, name, getattr(cls, name)))
            setattr(cls, name, timed(label, getattr(cls, name)))
    try:
        yield
    finally:
        for cls, name, method in originals:
            setattr(cls, name, method)


def linking_split(nlp, docs) -> dict[str, float]:
    """Seconds per part of one cold `nlp.pipe` pass (see the module docstring). Each pipe's generator is timed
    while it makes its next doc, which includes the pipes before it (it pulls its docs from theirs): a pipe's own
    share is its time less theirs, and spaCy's is the pass's less the last pipe's."""
    seconds: dict[str, float] = defaultdict(float)
    inclusive: dict[str, float] = defaultdict(float)

    def timed_pipe(name: str, pipe: Callable) -> Callable:
        def wrapper(stream, **kwargs):
            made = pipe(stream, **kwargs)
            while True:
                start = time.perf_counter()
                doc = next(made, None)
                inclusive[name] += time.perf_counter() - start
                if doc is None:
                    return
                yield doc

        return wrapper

    names = nlp.pipe_names
    for name, proc in nlp.pipeline:
        proc.pipe = timed_pipe(name, type(proc).pipe.__get__(proc))
    try:
        with timers(seconds):
            start = time.perf_counter()
            list(nlp.pipe(docs))
            total = time.perf_counter() - start
    finally:
        for _, proc in nlp.pipeline:
            del proc.pipe
    for before, name in zip([None, *names], names):
        seconds[name] = inclusive[name] - (inclusive[before] if before else 0.0)
    seconds["concept_normalizer: the rest (candidates, ranking, confidence)"] = (
        seconds.pop("concept_normalizer") - seconds["encoding"] - seconds["index search"]
    )
    seconds["spaCy (nlp.pipe less the pipes)"] = total - inclusive[names[-1]]
    return dict(seconds)


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Saved pipeline with a concept_normalizer", exists=True, file_okay=False),
    test: Path = typer.Option(None, help="Gold test docs (.spacy or PubTator; default: ../corpus/test.spacy)"),
    passes: int = typer.Option(5, min=1, help="Timed passes of each linker, taking turns"),
    end_to_end_passes: int = typer.Option(3, min=0, help="Timed passes of the whole pipeline over the abstracts"),
    tfidf_batch: int = typer.Option(64, min=1, help="Mentions per TF-IDF sparse product"),
    without: list[str] = typer.Option(
        [], help="A component to leave out of alternate end-to-end passes, to give its cost (repeatable)"
    ),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    test = test or pipeline.resolve().parent.parent / "corpus" / "test.spacy"
    nlp = spacy.load(pipeline, config={"components": {"concept_normalizer": {"cache_size": 0}}})
    gold = list(read_docs(test, nlp))
    linking = [name for name in nlp.pipe_names if name in LINKING_PIPES]
    mentions = [ent.text for doc in gold for ent in doc.ents]
    names = nlp.get_pipe("concept_normalizer").kb.names()
    tfidf = TfidfLinker(names, tfidf_batch)
    figures: dict = {
        "machine": machine(),
        "pipeline": str(pipeline),
        "test": str(test),
        "docs": len(gold),
        "mentions": len(mentions),
        "names": len(names),
        "linking_pipes": linking,
        "passes": [],
    }
    with nlp.select_pipes(enable=linking):
        list(nlp.pipe(strip_links(gold)))  # untimed: loads the encoder's weights
        tfidf.link(mentions)
        tfidf.link(mentions, dense=False)
        for _ in range(passes):
            run = {"load_before": os.getloadavg()[0]}
            docs = strip_links(gold)
            start = time.perf_counter()
            list(nlp.pipe(docs))
            run["pipeline_seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            tfidf.link(mentions)
            run["tfidf_seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            tfidf.link(mentions, dense=False)
            run["tfidf_sparse_argmax_seconds"] = time.perf_counter() - start
            run["split"] = linking_split(nlp, strip_links(gold))
            figures["passes"].append(run)
    ours = statistics.median(run["pipeline_seconds"] for run in figures["passes"])
    theirs = statistics.median(run["tfidf_seconds"] for run in figures["passes"])
    theirs_sparse = statistics.median(run["tfidf_sparse_argmax_seconds"] for run in figures["passes"])
    parts = list(figures["passes"][0]["split"])
    split = {part: statistics.median(run["split"][part] for run in figures["passes"]) for part in parts}
    figures.update(
        pipeline_mentions_per_second=len(mentions) / ours,
        tfidf_mentions_per_second=len(mentions) / theirs,
        tfidf_sparse_argmax_mentions_per_second=len(mentions) / theirs_sparse,
        ratio_sparse_argmax=theirs_sparse / ours,
        split_seconds=split,
        ratio=theirs / ours,
    )
    if end_to_end_passes:
        texts = [doc.text for doc in gold]
        list(nlp.pipe(texts[:2]))  # untimed: the recognizer's first batch
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(end_to_end_passes):
            for left_out in (False, True) if without else (False,):
                with nlp.select_pipes(disable=without if left_out else []):
                    start = time.perf_counter()
                    list(nlp.pipe(texts))
                    seconds[left_out].append(time.perf_counter() - start)
        figures["end_to_end_docs_per_second"] = len(texts) / statistics.median(seconds[False])
        if without:
            figures["end_to_end_without"] = without
            figures["end_to_end_docs_per_second_without"] = len(texts) / statistics.median(seconds[True])
    figures["load_average_after"] = os.getloadavg()[0]

    typer.echo(
        f"{pipeline}: {len(gold)} test docs, {len(mentions)} gold mentions, {len(names):,} KB names; "
        f"{passes} passes; {figures['machine']}"
    )
    loads = [run["load_before"] for run in figures["passes"]] + [figures["load_average_after"]]
    typer.echo(f"load average during the passes: {min(loads):.2f}-{max(loads):.2f}")
    typer.echo(f"\ncold pass, {' -> '.join(linking)}, cache off: where the time goes (median seconds)")
    typer.echo("| part | seconds | share |")
    typer.echo("|---|---|---|")
    for part, value in split.items():
        typer.echo(f"| {part} | {value:.3f} | {100 * value / sum(split.values()):.0f}% |")
    if end_to_end_passes:
        typer.echo(
            f"\nend to end ({' -> '.join(nlp.pipe_names)}, cache off): "
            f"{figures['end_to_end_docs_per_second']:.1f} docs/s"
        )
        if without:
            rate = figures["end_to_end_docs_per_second_without"]
            cost = 1 - figures["end_to_end_docs_per_second"] / rate
            typer.echo(f"without {', '.join(without)}: {rate:.1f} docs/s (their cost: {100 * cost:.0f}%)")
    typer.echo(
        f"\npipeline: {figures['pipeline_mentions_per_second']:,.0f} mentions/s; "
        f"TF-IDF (char 3-grams, brute force): {figures['tfidf_mentions_per_second']:,.0f} mentions/s "
        f"(with scikit-learn's sparse argmax: {figures['tfidf_sparse_argmax_mentions_per_second']:,.0f}, "
        f"ratio {figures['ratio_sparse_argmax']:.2f})"
    )
    if output:
        write_json(output, figures)
    typer.echo(f"ratio {figures['ratio']:.2f}")


if __name__ == "__main__":
    app()
