"""Abbreviation detection on the NCBI-disease corpus: precision/recall of each detector, and speed.

    python -m benchmarks.abbreviations --data ../shared/data/ncbi-disease

Gold pairs come from the corpus's own mentions: two gold mentions of one document that share a concept id and
stand as "LONG (SHORT)" or "SHORT (LONG)", where SHORT has at most 10 characters, no whitespace and a capital
letter, and LONG is longer. Only the definitions of disease abbreviations are annotated, so precision is taken
over the detected pairs whose short form is exactly a gold mention; the detector's other finds (genes, methods)
cannot be judged and are only counted.
"""

import argparse
import re
import time
from pathlib import Path

import spacy
from spacy.scorer import PRFScore
from spacy.util import filter_spans

from spacy_conceptnorm.io.corpus import read_pubtator
from spacy_conceptnorm.text.abbreviations import DETECTORS

FILES = ("NCBItrainset_corpus.txt", "NCBIdevelopset_corpus.txt", "NCBItestset_corpus.txt")
Pair = tuple[int, int, int, int]  # short_start, short_end, long_start, long_end


def load_documents(folder: Path) -> list:
    return [doc for name in FILES for doc in read_pubtator(folder / name)]


def concept_ids(annotation) -> set[str]:
    return {part.strip() for part in re.split(r"[|+]", annotation.id) if part.strip()}


def is_gold_short(text: str) -> bool:
    return len(text) <= 10 and not any(c.isspace() for c in text) and any(c.isupper() for c in text)


def gold_pairs(document) -> set[Pair]:
    """The (short, long) definitions the document's gold mentions spell out, as character offsets."""
    pairs = set()
    mentions = sorted(document.annotations, key=lambda a: a.start)
    text = document.text
    for first, second in zip(mentions, mentions[1:], strict=False):
        if not re.fullmatch(r"\s*\(\s*", text[first.end : second.start]):
            continue
        if not re.match(r"\s*[);,]", text[second.end :]) or not concept_ids(first) & concept_ids(second):
            continue
        for short, long in ((second, first), (first, second)):
            if is_gold_short(short.text) and len(long.text) > len(short.text):
                pairs.add((short.start, short.end, long.start, long.end))
    return pairs


def score(documents, detector) -> dict[str, float]:
    gold_total = judged = exact = short_found = detected = 0
    for document in documents:
        gold = gold_pairs(document)
        mention_spans = {(a.start, a.end) for a in document.annotations}
        found = {(a.short_start, a.short_end, a.long_start, a.long_end) for a in detector(document.text)}
        gold_by_short = {pair[:2]: pair for pair in gold}
        gold_total += len(gold)
        detected += len(found)
        judged += sum(pair[:2] in mention_spans for pair in found)
        exact += len(found & gold)
        short_found += sum(pair[:2] in gold_by_short for pair in found)
    prf = PRFScore(tp=exact, fp=judged - exact, fn=gold_total - exact)
    return {
        "gold": gold_total,
        "detected": detected,
        "judged": judged,
        "P": prf.precision,
        "R": prf.recall,
        "F1": prf.fscore,
        "short R": short_found / gold_total if gold_total else 0.0,
    }


def propagation(documents, detector_name: str) -> tuple[int, int]:
    """Of the gold mentions whose text is the short form of a gold pair of their document, how many get the gold
    long form (case-insensitive) as `ent._.long_form`, with the gold mentions as `doc.ents`."""
    nlp = spacy.blank("en")
    resolver = nlp.add_pipe("abbreviation_resolver", config={"detector": detector_name})
    right = total = 0
    for document in documents:
        text = document.text
        expected = {text[s:e]: text[ls:le].lower() for s, e, ls, le in gold_pairs(document)}
        if not expected:
            continue
        doc = nlp.make_doc(text)
        spans = [doc.char_span(a.start, a.end, label=a.type, alignment_mode="expand") for a in document.annotations]
        doc.ents = filter_spans([span for span in spans if span is not None])
        doc = resolver(doc)
        for ent in doc.ents:
            if ent.text in expected:
                total += 1
                right += (ent._.long_form or "").lower() == expected[ent.text]
    return right, total


def docs_per_second(texts: list[str], detector_name: str | None) -> float:
    nlp = spacy.blank("en")
    if detector_name is not None:
        nlp.add_pipe("abbreviation_resolver", config={"detector": detector_name})
    for _ in nlp.pipe(texts[:100]):  # warm-up: fills the tokenizer's caches
        pass
    start = time.perf_counter()
    for _ in nlp.pipe(texts, batch_size=64):
        pass
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with the NCBI-disease PubTator files")
    args = parser.parse_args()
    documents = load_documents(args.data)
    texts = [document.text for document in documents]
    print(__doc__[__doc__.index("Gold pairs") :].strip())
    print(f"\n{len(documents)} documents (train+develop+test), {sum(map(len, texts))} characters")
    print(f"tokenizer only: {docs_per_second(texts, None):.0f} docs/s\n")
    header = f"{'detector':<16}{'gold':>6}{'found':>7}{'judged':>8}{'P':>7}{'R':>7}{'F1':>7}"
    header += f"{'short R':>9}{'expanded':>14}{'docs/s':>9}"
    print(header)
    print("-" * len(header))
    for name, detector in DETECTORS.items():
        try:
            detector("warm-up (WU)")
        except ImportError as error:
            print(f"{name:<16}skipped: {error}")
            continue
        row = score(documents, detector)
        right, total = propagation(documents, name)
        speed = docs_per_second(texts, name)
        print(
            f"{name:<16}{row['gold']:>6}{row['detected']:>7}{row['judged']:>8}{row['P']:>7.3f}{row['R']:>7.3f}"
            f"{row['F1']:>7.3f}{row['short R']:>9.3f}{f'{right}/{total}':>14}{speed:>9.0f}"
        )
    print(
        "\nP, R, F1: exact (short, long) offsets. short R: gold short forms found with any long form. "
        "expanded: gold short-form mentions whose ent._.long_form is the gold long form (gold mentions as "
        "doc.ents). docs/s: blank English pipeline + abbreviation_resolver through nlp.pipe, one process."
    )


if __name__ == "__main__":
    main()
