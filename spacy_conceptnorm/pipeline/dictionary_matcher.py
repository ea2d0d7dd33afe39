"""Dictionary matching of entities: the knowledge base's names, found in the text, added to the recognizer's.

The `dictionary_matcher` component runs after `ner`. It finds the names of the knowledge base (MEDIC's 73k disease
names) and the gold mention texts of the training docs in each doc on their tokens' `LOWER` (every occurrence of
every name, as spaCy's `PhraseMatcher` finds them), keeps the longest of overlapping matches and merges them with
the entities already set:

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
run time. Beside them are saved their patterns, each name's token attribute hashes as one array, which are matched
as they are: loading tokenizes no name.
"""

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import srsly
from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.training import Example
from spacy.util import ensure_path, filter_spans, minibatch, registry
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors
from ..io.corpus import read_docs
from ..io.files import write_json, write_msgpack
from ..kb.knowledge_base import ONTOLOGY, KnowledgeBase

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
        self.patterns = TokenPatterns(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32))

    def __call__(self, doc: Doc) -> Doc:
        """Add the dictionary's matches to `doc.ents` by the merge rule.

        doc (Doc): The document, with the recognizer's entities set.
        RETURNS (Doc): The same doc.
        """
        return self.set_annotations(doc, self.match(doc))

    def pipe(self, stream: Iterable[Doc], *, batch_size: int = 128) -> Iterator[Doc]:
        """Add the dictionary's matches to each doc's entities, the docs of a batch matched at once.

        stream (Iterable[Doc]): The documents, with the recognizer's entities set.
        batch_size (int): The documents matched at once.
        YIELDS (Doc): The same docs, in turn.
        """
        error_handler = self.get_error_handler()
        for docs in minibatch(stream, size=batch_size):
            try:
                yield from [self.set_annotations(doc, found) for doc, found in zip(docs, self.matches(docs))]
            except Exception as e:
                error_handler(self.name, self, docs, e)

    def set_annotations(self, doc: Doc, found: list[Span]) -> Doc:
        """Merge the matches `found` in `doc` into its entities (and record those added); returns the doc."""
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
        return self.matches([doc])[0]

    def matches(self, docs: Sequence[Doc]) -> list[list[Span]]:
        """The dictionary's matches in each of `docs` (as `match` gives them), found for all at once."""
        label, attr = self.vocab.strings.add(self.cfg["label"]), self.cfg["attr"]
        found = self.patterns.find([doc.to_array(attr) for doc in docs])
        return [filter_spans([Span(doc, *span, label=label) for span in spans]) for doc, spans in zip(docs, found)]

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
        self.patterns = TokenPatterns(hashes, lengths)

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
        hashes, lengths = self.patterns.hashes, self.patterns.lengths
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


# Hand-written instead of spaCy's `PhraseMatcher`: its `add` builds a trie from one Python list per name, so loading
# MEDIC's 73k names took 0.46 s and +99 MB RSS; these arrays load in 0.04 s, +7 MB (AMD EPYC, AVX512-BF16).
MULTIPLIER = 0x9E3779B97F4A7C15  # odd, so that it has an inverse modulo 2**64
PAIR_BITS, KEY_BITS = 19, 20  # the filter tables have 2**19 and 2**20 entries


class TokenPatterns:
    """Token sequences, given as attribute hashes, found in token arrays: every occurrence of every sequence, as
    spaCy's `PhraseMatcher` finds them.

    A sequence's key is the polynomial sum_j token_j * multiplier**j (modulo 2**64). The windows of the docs looked
    at are every token and, where two tokens begin a longer sequence (a table by their key), the windows from there
    no longer than the longest such sequence; each gets its key from the prefix sums of token_m * multiplier**m,
    divided by multiplier**start. The keys that pass a table of the sequences' keys are looked up among them, sorted,
    and a window whose key is found is compared token by token with the sequences of that key, so that a collision
    never makes a match.

    hashes (np.ndarray): The sequences' attribute hashes, one after another (uint64).
    lengths (np.ndarray): The number of tokens of each sequence, in turn (uint32).
    multiplier (int): The keys' base (odd).
    """

    def __init__(self, hashes: np.ndarray, lengths: np.ndarray, multiplier: int = MULTIPLIER) -> None:
        self.hashes, self.lengths, self.multiplier = hashes, lengths, multiplier
        self.power = self.inverse = np.ones(1, dtype=np.uint64)
        self.grow(int(lengths.max(initial=0)))
        begins = np.cumsum(lengths, dtype=np.int64) - lengths
        present = np.flatnonzero(lengths)  # an empty sequence occurs nowhere
        within = np.arange(len(hashes)) - np.repeat(begins, lengths)
        keys = np.add.reduceat(hashes * self.power[within], begins[present]) if len(present) else hashes[:0]
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]  # and each key's sequence: where it begins in `hashes`, its length
        self.begins, self.sizes = begins[present][order], lengths[present][order].astype(np.int64)
        self.shared = np.append(self.keys[1:] == self.keys[:-1], False)  # the next sequence has the same key
        longer = np.flatnonzero(self.sizes > 1)
        self.windows = np.unique(self.sizes[longer])  # the sizes of the windows of more than one token
        pairs = hashes[self.begins[longer]] + hashes[self.begins[longer] + 1] * np.uint64(multiplier)  # their keys
        self.longest = np.zeros(1 << PAIR_BITS, dtype=np.int32)  # of the sequences that begin with a slot's pair
        np.maximum.at(self.longest, slot(pairs, PAIR_BITS), self.sizes[longer])
        self.seen = np.zeros(1 << KEY_BITS, dtype=bool)
        self.seen[slot(self.keys, KEY_BITS)] = True

    def grow(self, count: int) -> None:
        """Make `power` and `inverse` hold the first `count` powers (at least) of the multiplier and its inverse."""
        if len(self.power) >= count:
            return
        count = max(count, 2 * len(self.power))
        bases = np.tile(np.array([self.multiplier, pow(self.multiplier, -1, 1 << 64)], dtype=np.uint64), (count, 1))
        bases[0] = 1
        self.power, self.inverse = np.cumprod(bases, axis=0).T.copy()

    def find(self, arrays: Sequence[np.ndarray]) -> list[list[tuple[int, int]]]:
        """The (start, end) of every occurrence of a sequence in each of `arrays` (docs' attribute hashes), sorted;
        the arrays are searched as one."""
        if not len(self.keys) or not len(arrays):
            return [[] for _ in arrays]
        tokens, lengths = np.concatenate(arrays), np.array([len(array) for array in arrays])
        ends = np.cumsum(lengths)
        longest = self.longest[slot(tokens[:-1] + tokens[1:] * np.uint64(self.multiplier), PAIR_BITS)]
        starts = np.flatnonzero(longest)
        room = np.minimum(longest[starts], ends[np.searchsorted(ends, starts, side="right")] - starts)
        row, column = np.nonzero(self.windows <= room[:, None])  # the longer windows that may hold a sequence
        single = np.arange(len(tokens))  # and every one-token window
        start = np.concatenate([single, starts[row]])
        end = np.concatenate([single + 1, starts[row] + self.windows[column]])
        self.grow(len(tokens))
        prefix = np.zeros(len(tokens) + 1, dtype=np.uint64)
        np.cumsum(tokens * self.power[: len(tokens)], out=prefix[1:])
        keys = (prefix[end] - prefix[start]) * self.inverse[start]
        passed = np.flatnonzero(self.seen[slot(keys, KEY_BITS)])
        start, end, keys = start[passed], end[passed], keys[passed]
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = np.flatnonzero(self.keys[at] == keys)
        start, end, at = start[hit], end[hit], at[hit]
        right = self.sizes[at] == end - start
        right[right] = same_tokens(tokens, start[right], self.hashes, self.begins[at[right]], self.sizes[at[right]])
        for i in np.flatnonzero(~right & self.shared[at]).tolist():  # the key's other sequences
            right[i] = self.among(tokens[start[i] : end[i]], at[i] + 1)
        order = np.lexsort((end[right], start[right]))
        start, end = start[right][order], end[right][order]
        which = np.searchsorted(ends, start, side="right")
        begin = ends[which] - lengths[which]
        found = list(zip((start - begin).tolist(), (end - begin).tolist()))
        bounds = np.cumsum(np.bincount(which, minlength=len(arrays))).tolist()
        return [found[first:last] for first, last in zip([0, *bounds[:-1]], bounds)]

    def among(self, window: np.ndarray, at: int) -> bool:
        """Whether `window` is the sequence `at` or one after it in the keys' order with the same key."""
        while True:
            if self.sizes[at] == len(window) and np.array_equal(self.hashes[self.begins[at] :][: len(window)], window):
                return True
            if not self.shared[at]:
                return False
            at += 1


def same_tokens(a: np.ndarray, a_starts: np.ndarray, b: np.ndarray, b_starts: np.ndarray, sizes: np.ndarray):
    """Whether a[a_starts[i]:][:sizes[i]] equals b[b_starts[i]:][:sizes[i]], for each i (every size at least 1)."""
    if not len(sizes):
        return np.zeros(0, dtype=bool)
    firsts = np.cumsum(sizes) - sizes
    step = np.arange(firsts[-1] + sizes[-1])
    equal = a[step + np.repeat(a_starts - firsts, sizes)] == b[step + np.repeat(b_starts - firsts, sizes)]
    return np.logical_and.reduceat(equal, firsts)


def slot(values: np.ndarray, bits: int) -> np.ndarray:
    """Each hash's entry in a table of 2**bits: its top bits."""
    return values >> np.uint64(64 - bits)


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
    for batch in minibatch(docs, size=128):
        for doc, found in zip(batch, matcher.matches(batch)):
            gold = {(ent.start_char, ent.end_char) for ent in doc.ents if ent.label_ == label}
            for span in found:
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
