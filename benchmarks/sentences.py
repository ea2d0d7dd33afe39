"""Agreement of `clinical_context`'s two sentence splitters (`sentences = "rules"` and `"pyrush"`) as ConText sees
them (`doc.sents` after `split_report_sentences` and the sectionizer), and each splitter's time per document,
alternated in one run so that a busy machine moves both alike.

    python -m benchmarks.sentences [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import spacy
from spacy.tokens import Doc

from spacy_conceptnorm.evaluation.assertion import read_annotated_spans
from spacy_conceptnorm.io.corpus import read_pubtator
from spacy_conceptnorm.pipeline.clinical_context import split_report_sentences

SPLITTERS = ("pyrush", "rules")


def distinct_texts(path: Path) -> list[str]:
    """The texts of an `evaluate-assertion` file, each once, in file order."""
    return list(dict.fromkeys(span.text for span in read_annotated_spans(path)))


def sentence_starts(doc: Doc) -> set[int]:
    """Where each sentence starts: the offset of its first token that is not white space."""
    starts, pending = set(), True
    for token in doc:
        pending = pending or token.is_sent_start
        if pending and not token.is_space:
            starts.add(token.idx)
            pending = False
    return starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    abstracts = read_pubtator(args.data / "ncbi-disease" / "NCBIdevelopset_corpus.txt")
    sets = {
        "hand-written notes (`docs/clinical_notes/dev.jsonl`)": distinct_texts(Path("docs/clinical_notes/dev.jsonl")),
        "whole notes (`docs/clinical_notes/whole/dev.jsonl`)": distinct_texts(
            Path("docs/clinical_notes/whole/dev.jsonl")
        ),
        "`tests/fixtures/clinical/assertions.jsonl`": distinct_texts(Path("tests/fixtures/clinical/assertions.jsonl")),
        "NCBI-disease dev abstracts": [doc.text for doc in abstracts],
    }
    pipes = {}
    for name in SPLITTERS:
        pipes[name] = spacy.blank("en")
        pipes[name].add_pipe("clinical_context", config={"sentences": name})
    split = {name: nlp.get_pipe("clinical_context").sentencizer for name, nlp in pipes.items()}
    print("| texts | docs | PyRuSH sentence starts | precision | recall | docs identical | PyRuSH ms/doc", end="")
    print(" | rules ms/doc |")
    print("|---|---|---|---|---|---|---|---|")
    for label, texts in sets.items():
        tp = fp = fn = same = 0
        for text in texts:
            reference, ours = sentence_starts(pipes["pyrush"](text)), sentence_starts(pipes["rules"](text))
            tp, fp, fn = tp + len(reference & ours), fp + len(ours - reference), fn + len(reference - ours)
            same += reference == ours
        seconds = dict.fromkeys(SPLITTERS, 0.0)
        for text in texts:
            for name in ("pyrush", "rules", "rules", "pyrush"):
                doc = pipes[name].make_doc(text)
                start = time.perf_counter()
                split[name](doc)
                split_report_sentences(doc)
                seconds[name] += time.perf_counter() - start
        ms = {name: s / (2 * len(texts)) * 1000 for name, s in seconds.items()}
        print(
            f"| {label} | {len(texts)} | {tp + fn} | {tp / (tp + fp):.3f} | {tp / (tp + fn):.3f} | "
            f"{same}/{len(texts)} | {ms['pyrush']:.2f} | {ms['rules']:.3f} |"
        )


if __name__ == "__main__":
    main()
