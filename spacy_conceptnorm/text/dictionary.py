"""Dictionary matching of entities: the knowledge base's names, found in the text, added to the recognizer's.

The `dictionary_matcher` component runs after `ner`. It finds the names of the knowledge base (MEDIC's 73k disease
names) and the gold mention texts of the training docs in each doc with spaCy's `PhraseMatcher` on `LOWER`,
keeps the longest of overlapping matches and merges them with the entities already set:

- `merge = "longest"`: of overlapping entities and matches, the longest span wins (ties: the entity);
- `merge = "fill"`: a match is added only where no entity overlaps it;
- `merge = "names"`: as "longest", but an entity that is not itself a match and holds matches is replaced by them.
  For clinical notes, where the recognizer trained on abstracts takes in words around a condition ("complaints of
  SHORTNESS OF BREATH", "RLQ ABDOMINAL PAIN", "urinary incontinence develop") and the longer span links with a low
  confidence.

The entities it added (a match that became an entity where the recognizer had none with its exact span) are also
kept in `doc.spans[spans_key]` ("dictionary"), as spaCy's `span_ruler` keeps its matches: `link_filter` can hold
them to a higher confidence than the recognizer's own (`min_confidence_dictionary`).

Many names are also ordinary words or parts of longer mentions ("disease", "cancer" in "breast cancer", gene names
that are disease names too). `initialize` therefore measures each name on the training docs: a name matched there
is kept only when at least `min_precision` of its matches are gold entities with exactly its span; a name never
matched in training is kept (`keep_unseen`). The kept names are saved with the pipeline; the KB is not needed at
run time. Beside them are saved their patterns, each name's token attribute hashes as one array: `PhraseMatcher.add`
takes such sequences as it takes docs, so loading skips tokenizing the names (MEDIC's 71,923: 0.3 s instead of 6.6 s).
"""

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import srsly
from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.training import Example
from spacy.util import ensure_path, filter_spans, registry
from spacy.vocab import Vocab

from ..corpus import read_docs
from ..errors import ConceptNormError, Errors
from ..kb import ONTOLOGY, KnowledgeBase
from ..util import write_json, write_msgpack

MERGES = ("longest", "fill", "names")
NAMES_FILE = "names.json"
PATTERNS_FILE = "patterns.msgpack"


class DictionaryMatcher(Pipe):
    """Add the dictionary's names found in a doc to its entities (see the module docstring)."""

    def __init__(
        self,
        vocab: Vocab,
        name: str = "dictionary_matcher",
        *,
        label: str = "Disease",
        attr: str = "LOWER",
        merge: str = "longest",
        min_precision: float = 0.5,
        keep_unseen: bool = True,
        min_length: int = 2,
        spans_key: str | None = "dictionary",
    ) -> None:
        """Initialize the component (it matches nothing until `initialize` or `from_disk` gives it names).

        vocab (Vocab): The pipeline's vocab.
        name (str): The component's name.
        label (str): The label of the entities it adds.
        attr (str): The token attribute matched ("LOWER": case-insensitive; "ORTH": exact).
        merge (str): "longest", "fill" or "names" (see the module docstring).
        min_precision (float): The share of a name's matches in the training docs that must be gold entities.
        keep_unseen (bool): Keep the names never matched in the training docs.
        min_length (int): Names shorter than this many characters are left out.
        spans_key (Optional[str]): The `doc.spans` key of the entities it added; None keeps no record.
        """
        if merge not in MERGES:
            raise ConceptNormError(
                Errors.E410.format(component=name, key="merge", expected=f"one of {MERGES}", value=merge)
            )
        if not 0.0 <= min_precision <= 1.0:
            raise ConceptNormError(
                Errors.E410.format(component=name, key="min_precision", expected="in [0, 1]", value=min_precision)
            )
        self.vocab = vocab
        self.name = name
        self.cfg = {
            "label": label,
            "attr": attr,
            "merge": merge,
            "min_precision": min_precision,
            "keep_unseen": keep_unseen,
            "min_length": min_length,
            "spans_key": spans_key,
        }
        self.names: list[str] = []
        self.patterns = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32))  # (hashes, tokens per name)
        self.matcher = PhraseMatcher(vocab, attr=attr)

    def __call__(self, doc: Doc) -> Doc:
        """Add the dictionary's matches to `doc.ents` by the merge rule.

        doc (Doc): The document, with the recognizer's entities set.
        RETURNS (Doc): The same doc.
        """
        found = self.match(doc)
        recognized = {(ent.start, ent.end) for ent in doc.ents}
        if found:
            ents = list(doc.ents)
            if self.cfg["merge"] == "fill":
                taken = [False] * len(doc)
                for ent in ents:
                    taken[ent.start : ent.end] = [True] * len(ent)
                ents += [span for span in found if not any(taken[span.start : span.end])]
            else:
                if self.cfg["merge"] == "names":
                    ents = [ent for ent in ents if not holds_names(ent, found)]
                ents = filter_spans(ents + found)  # longest first; on a tie, the earlier in the list: the entity
            doc.ents = sorted(ents)
        if self.cfg["spans_key"] is not None:
            matched = {(span.start, span.end) for span in found} - recognized
            doc.spans[self.cfg["spans_key"]] = [ent for ent in doc.ents if (ent.start, ent.end) in matched]
        return doc

    def match(self, doc: Doc) -> list[Span]:
        """The dictionary's matches in `doc`, the longest of overlapping ones, labelled."""
        label = self.cfg["label"]
        return filter_spans([Span(doc, start, end, label=label) for _, start, end in self.matcher(doc)])

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]],
        *,
        nlp: Language | None = None,
        kb: KnowledgeBase | None = None,
        names: Sequence[str] = (),
        docs: Sequence[Doc] | None = None,
    ) -> None:
        """Collect the names and keep those precise enough on the training docs.

        get_examples (Callable[[], Iterable[Example]]): The training examples, whose gold (reference) docs are
            the training docs when `docs` is None.
        nlp (Optional[Language]): The pipeline (unused; spaCy passes it).
        kb (Optional[KnowledgeBase]): Its ontology names (as first written) are the dictionary.
        names (Sequence[str]): More names.
        docs (Optional[Sequence[Doc]]): The training docs with gold entities (`spacy_conceptnorm.gold_docs.v1` in
            the config's [initialize.components.dictionary_matcher] section): their entities are names too, and
            measure each name's precision.
        """
        docs = [eg.reference for eg in get_examples()] if docs is None else list(docs)
        label = self.cfg["label"]
        candidates = set(names)
        if kb is not None:
            candidates.update(kb.surface(name) for name in kb.names(ONTOLOGY))
        candidates.update(ent.text for doc in docs for ent in doc.ents if ent.label_ == label)
        self.set_names(sorted(candidates))
        matched, right = precision_counts(self, docs)
        self.set_names([name for name in self.names if self.keeps(self.key(name), matched, right)])

    def keeps(self, key: str, matched: Counter, right: Counter) -> bool:
        """Whether a name (by its matched form) is kept, given its matches and right matches in training."""
        if not matched[key]:
            return self.cfg["keep_unseen"]
        return right[key] >= self.cfg["min_precision"] * matched[key]

    def key(self, text: str) -> str:
        """The matched form of a name: lowercased for `attr = "LOWER"`, as written otherwise."""
        return text.lower() if self.cfg["attr"] == "LOWER" else text

    def set_names(self, names: Iterable[str]) -> None:
        """Match exactly these names (replacing any before); names shorter than `min_length` are left out."""
        names = sorted({n.strip() for n in names if len(n.strip()) >= self.cfg["min_length"]})
        attr = self.cfg["attr"]
        tokens = [doc.to_array(attr) for doc in self.vocab_tokenizer().pipe(names)]
        hashes = np.concatenate(tokens).astype(np.uint64) if tokens else np.zeros(0, dtype=np.uint64)
        self._set_patterns(names, hashes, np.array([len(t) for t in tokens], dtype=np.uint32))

    def _set_patterns(self, names: list[str], hashes: np.ndarray, lengths: np.ndarray) -> None:
        """Match `names`, whose patterns are the `lengths[i]` attribute hashes of name i, in turn, in `hashes`."""
        self.names = names
        self.patterns = (hashes, lengths)
        self.matcher = PhraseMatcher(self.vocab, attr=self.cfg["attr"])
        if names:
            flat, ends = hashes.tolist(), np.cumsum(lengths).tolist()
            self.matcher.add(self.cfg["label"], [flat[start:end] for start, end in zip([0, *ends[:-1]], ends)])

    def vocab_tokenizer(self):
        """A tokenizer for the names: the default English one on this vocab (names need no pipeline)."""
        from spacy.lang.en import English

        return English(vocab=self.vocab).tokenizer

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Save the settings and the kept names, and their patterns, into the directory `path` (atomically)."""
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / NAMES_FILE, {"cfg": self.cfg, "names": self.names})
        write_msgpack(path / PATTERNS_FILE, self._patterns_state())

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> "DictionaryMatcher":
        """Load what `to_disk` saved (a pipeline saved without patterns gets them from its names); a missing or
        malformed file raises E411 naming it."""
        path = ensure_path(path)
        source = path / NAMES_FILE
        data = self._read(source, srsly.read_json)
        if (path / PATTERNS_FILE).exists():
            source = path / PATTERNS_FILE
            data.update(self._read(source, lambda file: srsly.msgpack_loads(file.read_bytes())))
        return self._set_state(data, source)

    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        """The settings, the kept names and their patterns as a bytestring."""
        return srsly.msgpack_dumps({"cfg": self.cfg, "names": self.names, **self._patterns_state()})

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = ()) -> "DictionaryMatcher":
        """Load what `to_bytes` gave; malformed data raises E411."""
        return self._set_state(self._read(bytes_data, srsly.msgpack_loads), "the bytes given")

    @staticmethod
    def _read(source: Path | bytes, read: Callable) -> dict:
        where = source if isinstance(source, Path) else "the bytes given"
        try:
            data = read(source)
        except Exception as e:  # msgpack raises several unrelated types on malformed data
            raise ConceptNormError(Errors.E411.format(path=where, detail=f"{type(e).__name__}: {e}")) from None
        if not isinstance(data, dict):
            raise ConceptNormError(Errors.E411.format(path=where, detail=f"a {type(data).__name__}, not a mapping"))
        return data

    def _patterns_state(self) -> dict:
        hashes, lengths = self.patterns
        data = {"attr": self.cfg["attr"], "hashes": hashes.tobytes(), "lengths": lengths.tobytes()}
        return {**data, "crc32": zlib.crc32(data["lengths"], zlib.crc32(data["hashes"]))}

    def _set_state(self, data: dict, source: object) -> "DictionaryMatcher":
        try:
            cfg, names = dict(data["cfg"]), list(data["names"])
            self.cfg.update(cfg)
            if "hashes" not in data:
                self.set_names(names)
                return self
            hashes = np.frombuffer(data["hashes"], dtype=np.uint64)
            lengths = np.frombuffer(data["lengths"], dtype=np.uint32)
            if zlib.crc32(data["lengths"], zlib.crc32(data["hashes"])) != data["crc32"]:
                raise ValueError("the patterns' checksum does not match")
            if data["attr"] != self.cfg["attr"] or len(lengths) != len(names) or lengths.sum() != len(hashes):
                raise ValueError(f"{len(names)} names, {len(lengths)} patterns of {data['attr']!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E411.format(path=source, detail=e)) from None
        self._set_patterns(names, hashes, lengths)
        return self


def holds_names(ent: Span, found: list[Span]) -> bool:
    """Whether the entity holds a match (`found`) inside it and is not one itself."""
    inside = [(m.start, m.end) for m in found if ent.start <= m.start and m.end <= ent.end]
    return bool(inside) and (ent.start, ent.end) not in inside


@registry.misc("spacy_conceptnorm.gold_docs.v1")
def gold_docs(path: str | Path | None) -> list[Doc]:
    """The docs with gold entities of a `.spacy` DocBin, a PubTator file or a folder of `.spacy` files (none for
    None).

    path (Optional[Path]): The file or folder.
    """
    return [] if path is None else list(read_docs(path))


def precision_counts(matcher: DictionaryMatcher, docs: Iterable[Doc]) -> tuple[Counter, Counter]:
    """How often each name (by its matched form) matches in the gold docs, and how often exactly on a gold entity
    of the matcher's label."""
    label = matcher.cfg["label"]
    matched: Counter = Counter()
    right: Counter = Counter()
    for doc in docs:
        gold = {(ent.start_char, ent.end_char) for ent in doc.ents if ent.label_ == label}
        for span in matcher.match(doc):
            key = matcher.key(span.text)
            matched[key] += 1
            right[key] += (span.start_char, span.end_char) in gold
    return matched, right


@Language.factory(
    "dictionary_matcher",
    assigns=["doc.ents"],
    default_config={
        "label": "Disease",
        "attr": "LOWER",
        "merge": "longest",
        "min_precision": 0.5,
        "keep_unseen": True,
        "min_length": 2,
        "spans_key": "dictionary",
    },
)
def make_dictionary_matcher(
    nlp: Language,
    name: str,
    label: str,
    attr: str,
    merge: str,
    min_precision: float,
    keep_unseen: bool,
    min_length: int,
    spans_key: str | None,
) -> DictionaryMatcher:
    """Create a DictionaryMatcher (see its docstring for the settings)."""
    return DictionaryMatcher(
        nlp.vocab,
        name,
        label=label,
        attr=attr,
        merge=merge,
        min_precision=min_precision,
        keep_unseen=keep_unseen,
        min_length=min_length,
        spans_key=spans_key,
    )
