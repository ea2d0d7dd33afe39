"""Dictionary matching of entities: the knowledge base's names, found in the text, added to the recognizer's.

The `dictionary_matcher` component runs after `ner`. It finds the names of the knowledge base (MEDIC's 73k disease
names) and the gold mention texts of the training docs in each doc with spaCy's `PhraseMatcher` on `LOWER`,
keeps the longest of overlapping matches and merges them with the entities already set:

- `merge = "longest"`: of overlapping entities and matches, the longest span wins (ties: the entity);
- `merge = "fill"`: a match is added only where no entity overlaps it.

The entities it added (a match that became an entity where the recognizer had none with its exact span) are also
kept in `doc.spans[spans_key]` ("dictionary"), as spaCy's `span_ruler` keeps its matches: `link_filter` can hold
them to a higher confidence than the recognizer's own (`min_confidence_dictionary`).

Many names are also ordinary words or parts of longer mentions ("disease", "cancer" in "breast cancer", gene names
that are disease names too). `initialize` therefore measures each name on the training docs: a name matched there
is kept only when at least `min_precision` of its matches are gold entities with exactly its span; a name never
matched in training is kept (`keep_unseen`). The kept names are saved with the pipeline; the KB is not needed at
run time.
"""

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

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
from ..util import write_json

MERGES = ("longest", "fill")
NAMES_FILE = "names.json"


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
        merge (str): "longest" or "fill" (see the module docstring).
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
        self.names = sorted({n.strip() for n in names if len(n.strip()) >= self.cfg["min_length"]})
        self.matcher = PhraseMatcher(self.vocab, attr=self.cfg["attr"])
        if self.names:
            self.matcher.add(self.cfg["label"], list(self.vocab_tokenizer().pipe(self.names)))

    def vocab_tokenizer(self):
        """A tokenizer for the names: the default English one on this vocab (names need no pipeline)."""
        from spacy.lang.en import English

        return English(vocab=self.vocab).tokenizer

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Save the settings and the kept names into the directory `path` (atomically)."""
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / NAMES_FILE, self._state())

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> "DictionaryMatcher":
        """Load what `to_disk` saved; a missing or malformed file raises E411 naming it."""
        file = ensure_path(path) / NAMES_FILE
        try:
            data = srsly.read_json(file)
        except (OSError, ValueError) as e:
            raise ConceptNormError(Errors.E411.format(path=file, detail=e)) from None
        return self._set_state(data, file)

    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        """The settings and the kept names as a bytestring (what `to_disk` writes)."""
        return srsly.json_dumps(self._state()).encode("utf8")

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = ()) -> "DictionaryMatcher":
        """Load what `to_bytes` gave; malformed data raises E411."""
        try:
            data = srsly.json_loads(bytes_data)
        except ValueError as e:
            raise ConceptNormError(Errors.E411.format(path="the bytes given", detail=e)) from None
        return self._set_state(data, "the bytes given")

    def _state(self) -> dict:
        return {"cfg": self.cfg, "names": self.names}

    def _set_state(self, data: object, source: object) -> "DictionaryMatcher":
        try:
            cfg, names = dict(data["cfg"]), list(data["names"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E411.format(path=source, detail=e)) from None
        self.cfg.update(cfg)
        self.set_names(names)
        return self


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
