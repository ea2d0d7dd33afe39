"""Pre-trained word vectors for BNE: skip-gram (gensim's word2vec) on the text available offline.

The paper's vectors come from skip-gram on 29M PubMed abstracts (200-d, window 6, 5 negatives, words seen at
least 3 times). Offline we train the same model on what is here: the titles and abstracts of PubTator files
(NCBI-disease train + develop; never the test split), each MEDIC name as a sentence of its own (so the names of
one concept never share a context window: the vectors learn nothing about synonymy from the dictionary's
grouping) and, when given, the definitions of a CTD diseases TSV. Vectors are written and read in the
word2vec text format (`count dim`, then `word v1 .. vdim` per line), which needs no gensim to read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConceptNormError, Errors
from ..io.corpus import read_pubtator
from ..io.files import atomic_open, read_lines
from ..kb.knowledge_base import load_kb
from ..text.normalize import TextNormalizer

_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


@dataclass
class WordVectors:
    """words (List[str]): The words, one per row. vectors (np.ndarray): (words, dim) float32."""

    words: list[str]
    vectors: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def to_disk(self, path: str | Path) -> None:
        """Write the word2vec text format, atomically."""
        with atomic_open(path, "w") as f:
            f.write(f"{len(self.words)} {self.dim}\n")
            for word, row in zip(self.words, self.vectors):
                f.write(word + " " + " ".join(f"{x:.6g}" for x in row) + "\n")

    @classmethod
    def from_disk(cls, path: str | Path) -> WordVectors:
        """Read the word2vec text format; a malformed file raises ConceptNormError naming file and line."""
        words, rows, dim = [], [], None
        for lineno, line in read_lines(path):
            parts = line.rstrip().split(" ")
            if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                dim = int(parts[1])
                continue
            dim = dim or len(parts) - 1
            try:
                if len(parts) != dim + 1 or dim < 1:
                    raise ValueError(f"expected a word and {dim} numbers, got {len(parts)} fields")
                rows.append(np.array(parts[1:], dtype=np.float32))
            except ValueError as e:
                raise ConceptNormError(Errors.E961.format(path=f"{path}:{lineno}", detail=e)) from None
            words.append(parts[0])
        if not words:
            raise ConceptNormError(Errors.E961.format(path=path, detail="no vectors"))
        return cls(words, np.stack(rows))


def text_sentences(
    pubtator: Iterable[str | Path] = (),
    kb_path: str | Path | None = None,
    ctd_tsv: str | Path | None = None,
    normalizer: TextNormalizer | None = None,
) -> Iterator[list[str]]:
    """Tokenized sentences (normalized as BNE normalizes names) from PubTator documents, a knowledge base's names
    (one sentence each) and a CTD TSV's definitions."""
    normalizer = normalizer or TextNormalizer()
    for path in pubtator:
        for doc in read_pubtator(path):
            for sentence in _SENTENCE_END.split(doc.text):
                words = normalizer(sentence).split()
                if words:
                    yield words
    if kb_path is not None:
        kb = load_kb(kb_path)
        for name in kb.names():
            yield name.split()  # KB keys are normalized with the default normalizer already
    if ctd_tsv is not None:
        for _, line in read_lines(ctd_tsv):
            fields = line.split("\t")
            if line.startswith("#") or len(fields) < 4 or not fields[3]:
                continue
            for sentence in _SENTENCE_END.split(fields[3]):
                words = normalizer(sentence).split()
                if words:
                    yield words


def train_word_vectors(
    sentences: Iterable[list[str]],
    dim: int = 200,
    window: int = 6,
    negative: int = 5,
    min_count: int = 1,
    epochs: int = 10,
    seed: int = 0,
    workers: int = 1,
) -> WordVectors:
    """Skip-gram with negative sampling (gensim's Word2Vec, sg=1), the paper's settings by default except
    `min_count` (3 in the paper, over PubMed; 1 here, where the text is small) and more epochs for a small text.
    Words come out most frequent first."""
    try:
        from gensim.models import Word2Vec
    except ImportError:
        raise ConceptNormError(Errors.E963) from None
    sentences = list(sentences)
    model = Word2Vec(
        sentences, vector_size=dim, window=window, negative=negative, sg=1, min_count=min_count, epochs=epochs,
        seed=seed, workers=workers,
    )  # fmt: skip
    kv = model.wv
    return WordVectors(list(kv.index_to_key), np.asarray(kv.vectors, dtype=np.float32))
