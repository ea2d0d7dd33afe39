"""The `concept_normalizer` pipeline component: links `doc.ents` to knowledge-base concepts.

For each entity it sets
- `ent.kb_id_`: the best concept id; parts of a composite joined by "|" in text order; "NIL" when its confidence
  is under `nil_threshold` (or the mention is empty);
- `ent._.kb_ents`: [(concept_id, score), ...] best first, scispacy's shape (ranker probabilities when the ranker
  answered, else cosines); for a composite, the parts' candidates merged (per part in `kb_parts`);
- `ent._.kb_confidence`: the probability that `kb_id_` is right (calibrated on dev by `calibrate`; the lowest
  part's for a composite); `kb_id_` is "NIL" when it is under `nil_threshold`;
- `ent._.kb_name`, `ent._.kb_stage`: the name that matched and the sieve stage that answered ("|"-joined parts);
- `ent._.kb_parts`: per part, {"text", "kb_id", "candidates", "name", "stage", "confidence"}.
Values live in `doc.user_data`, so they survive DocBin (store_user_data=True) and `nlp.pipe(n_process=...)`.
"""

import inspect
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import srsly
from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.scorer import Scorer
from spacy.tokens import Doc, Span
from spacy.training import Example, validate_get_examples
from spacy.util import SimpleFrozenList, from_disk, minibatch, to_disk
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors, Warnings
from ..io.files import (
    CHECKSUMS,
    check_files,
    checksums_skipped,
    read_checksums,
    read_json,
    write_checksums,
    write_dir_atomically,
    write_json,
)
from ..kb.knowledge_base import DOMAIN, SOURCE_BITS, KnowledgeBase, checked_pairs
from ..linking.consistency import make_consistent
from ..linking.linker import Linker
from ..linking.ranker import Ranker
from ..linking.scoring import NIL, gold_ids, score_linking
from ..ml.name_encoder import PACKAGED_MODEL, NameEncoder
from ..search.index import INDEX_TYPES, VectorIndex
from ..search.sieve import Match, SieveSearcher

MAX_MENTION_CHARS = 1000  # longer entities are cut before normalization; names are at most ~25 tokens anyway
LONG_FORM_MODES = ("best", "long", "mention")
INDEX_SETTINGS = tuple(p for p in inspect.signature(VectorIndex).parameters if p != "dim")
NEL_KEYS = ("nel_micro_p", "nel_micro_r", "nel_micro_f")  # spaCy's standard linking scores, next to kb_acc

CONTEXT_CHARS = 200  # characters of text each side of a mention handed to the ranker's context-aware scorers
_EXTENSIONS = ("kb_ents", "kb_name", "kb_stage", "kb_parts", "kb_confidence")
for _name, _default in ((n, None) for n in _EXTENSIONS):
    if not Span.has_extension(_name):
        Span.set_extension(_name, default=_default)

DEFAULT_CONFIG = {
    "encoder": {"@misc": "spacy_conceptnorm.NameEncoder.v1", "model": None},
    "strategy": "D-T+OD-T",
    "threshold": 0.95,
    "top_k": 5,
    "nil_threshold": 0.0,
    "labels": [],
    "batch_size": 128,
    "index": {"index_type": "auto"},
    "long_form": "best",
    "split_composites": True,
    "ranker": {"@misc": "spacy_conceptnorm.ranker.v1"},
    "consistency": True,
    "cache_size": 100_000,
    "scorer": {"@scorers": "spacy_conceptnorm.linking_scorer.v1"},
}


@Language.factory(
    "concept_normalizer",
    default_config=DEFAULT_CONFIG,
    assigns=[f"span._.{n}" for n in _EXTENSIONS],
    default_score_weights={"kb_acc": 1.0, "kb_acc5": 0.0, "kb_found": 0.0},
)
def make_concept_normalizer(
    nlp: Language,
    name: str,
    encoder: NameEncoder,
    strategy: str,
    threshold: float,
    top_k: int,
    nil_threshold: float,
    labels: list[str],
    batch_size: int,
    index: dict,
    long_form: str,
    split_composites: bool,
    ranker: Ranker | None,
    consistency: bool,
    cache_size: int,
    scorer: Callable | None,
) -> "ConceptNormalizer":
    """Create a ConceptNormalizer (see its docstring for the settings, checked here)."""
    return ConceptNormalizer(
        nlp.vocab,
        name,
        encoder=encoder,
        strategy=strategy,
        threshold=threshold,
        top_k=top_k,
        nil_threshold=nil_threshold,
        labels=labels,
        batch_size=batch_size,
        index=index,
        long_form=long_form,
        split_composites=split_composites,
        ranker=ranker,
        consistency=consistency,
        cache_size=cache_size,
        scorer=scorer,
    )


class ConceptNormalizer(Pipe):
    """Link entities to concepts with a sieve search over name vectors.

    vocab (Vocab): The shared vocabulary.
    name (str): The component instance name.
    encoder (Optional[NameEncoder]): Encodes names and mentions (any transformers model); None: the packaged
        all-MiniLM-L6-v2.
    strategy (str): Sieve stages joined by "+", each TARGET-REPR with TARGET in O, D, OD and REPR in T, C.
    threshold (float): A stage before the last answers only when its best cosine reaches this.
    top_k (int): Candidates kept per entity in `ent._.kb_ents`.
    nil_threshold (float): Links whose confidence is under this give `kb_id_` "NIL".
    labels (List[str]): Entity labels to link; empty links all.
    batch_size (int): Docs gathered per search in `pipe`.
    index (dict): Vector index settings: `index_type` ("auto": chosen from the number of names, see
        `search.index.choose_index_type`; "exact", "flat", "hnsw", "ivf", "ivfpq") and its parameters.
    long_form (str): With `abbreviation_resolver` (or scispacy's `AbbreviationDetector`, whose `span._.long_form`
        is a Span) before it: "best" searches the mention and its long form and keeps the better score, "long"
        the long form only, "mention" ignores long forms.
    split_composites (bool): With `composite_splitter` before it, link each part of a composite mention.
    ranker (Optional[Ranker]): The second stage over the sieve's and lexical candidates (trained by
        `spacy_conceptnorm train-ranker`; until then, and when it keeps the sieve's order, the sieve's answer
        stands and no lexical index is built). None: the sieve alone.
    consistency (bool): One normalized mention text gets one concept within a document unless the linker is
        confident otherwise, and an undefined abbreviation takes the concept of the entity it abbreviates.
    cache_size (int): Normalized mention texts whose answers are remembered across batches (least recently
        linked dropped first; 0 turns the cache off). Answers are cached only while the ranker reads no context;
        changing the synonyms, the strategy, the threshold or the ranker empties the cache. See `cache_info`.
    scorer (Optional[Callable]): Scores linking accuracy for `nlp.evaluate`.
    """

    def __init__(
        self,
        vocab: Vocab,
        name: str = "concept_normalizer",
        *,
        encoder: NameEncoder | None = None,
        strategy: str = "D-T+OD-T",
        threshold: float = 0.95,
        top_k: int = 5,
        nil_threshold: float = 0.0,
        labels: Iterable[str] = (),
        batch_size: int = 128,
        index: dict | None = None,
        long_form: str = "best",
        split_composites: bool = True,
        ranker: Ranker | None = None,
        consistency: bool = True,
        cache_size: int = 100_000,
        scorer: Callable | None = score_linking,
    ) -> None:
        SieveSearcher.validate(strategy, top_k)
        _check(_number_in(threshold, -1.0, 1.0), "threshold", "a cosine in [-1, 1]", threshold)
        _check(_number_in(nil_threshold, 0.0, 1.0), "nil_threshold", "a confidence in [0, 1]", nil_threshold)
        _check(_int_from(batch_size, 1), "batch_size", "a positive integer", batch_size)
        _check(not isinstance(labels, str) and all(isinstance(x, str) for x in labels), "labels", "a list", labels)
        _check(long_form in LONG_FORM_MODES, "long_form", f"one of {LONG_FORM_MODES}", long_form)
        _check(isinstance(split_composites, bool), "split_composites", "true or false", split_composites)
        _check(isinstance(consistency, bool), "consistency", "true or false", consistency)
        _check(_int_from(cache_size, 0), "cache_size", "an integer >= 0", cache_size)
        _check_index(index or {})
        self.vocab = vocab
        self.name = name
        self.encoder = encoder if encoder is not None else NameEncoder()
        self.model = None  # no thinc model: the encoder is trained by `spacy_conceptnorm train`
        self.cfg: dict[str, Any] = {
            "strategy": strategy,
            "threshold": threshold,
            "top_k": top_k,
            "nil_threshold": nil_threshold,
            "labels": list(labels),
            "batch_size": batch_size,
            "index": dict(index or {}),
            "long_form": long_form,
            "split_composites": split_composites,
            "consistency": consistency,
        }
        self.ranker = ranker
        self.scorer = scorer
        self.searcher: SieveSearcher | None = None
        self.linker: Linker | None = None
        self._cache_size = cache_size  # a setting of this process, like the encoder's device: not saved in cfg

    @property
    def cache_size(self) -> int:
        """Mention texts whose answers are remembered across batches (0: none)."""
        return self._cache_size

    @cache_size.setter
    def cache_size(self, value: int) -> None:
        _check(_int_from(value, 0), "cache_size", "an integer >= 0", value)
        self._cache_size = value
        if self.linker is not None:
            self.linker.resize(value)

    def _new_linker(self) -> Linker:
        return Linker(self.searcher, self.ranker, cache_size=self.cache_size)

    def cache_info(self) -> dict[str, int]:
        """The cache of linked mention texts (`Linker.cache_info`): {"hits", "lookups" (distinct texts per batch
        looked up), "size", "max_size"}, counted since the pipeline was loaded or initialized (zeros while the
        cache is off because the ranker reads contexts)."""
        if self.linker is None:
            return {"hits": 0, "lookups": 0, "size": 0, "max_size": self.cache_size}
        return self.linker.cache_info()

    # --- set-up -------------------------------------------------------------------------------------------------
    @property
    def kb(self) -> KnowledgeBase:
        if self.searcher is None:
            raise ConceptNormError(Errors.E301.format(name=self.name))
        return self.searcher.kb

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]] | None = None,
        *,
        nlp: Language | None = None,
        kb: KnowledgeBase | None = None,
        synonyms: Iterable[tuple[str, str]] = (),
        domain_synonyms: bool = True,
        progress: bool = False,
    ) -> None:
        """Load the knowledge base, add domain synonyms, encode all names.

        get_examples (Callable[[], Iterable[Example]]): Training examples; gold entities with a `kb_id_` become
            domain synonyms (the paper's D). Composite gold ids are skipped.
        nlp (Language): The pipeline.
        kb (KnowledgeBase): The knowledge base, e.g. from `spacy_conceptnorm.load_kb.v1` in [initialize].
        synonyms (Iterable[Tuple[str, str]]): More (text, concept id) domain synonyms, e.g. from
            `spacy_conceptnorm.domain_synonyms.v1` in [initialize].
        domain_synonyms (bool): Take domain synonyms from the examples.
        progress (bool): Show a progress bar while encoding names.
        """
        if get_examples is not None:
            validate_get_examples(get_examples, "ConceptNormalizer.initialize")
        if kb is None:
            if self.searcher is None:
                raise ConceptNormError(Errors.E301.format(name=self.name))
            kb = self.searcher.kb
        pairs = list(synonyms)
        if get_examples is not None and domain_synonyms:
            pairs += [
                (ent.text, ent.kb_id_)
                for eg in get_examples()
                for ent in eg.reference.ents
                if ent.kb_id_ and ent.kb_id_ != NIL and len(gold_ids(ent.kb_id_)) == 1
            ]
        if pairs:
            _, unknown = kb.add_names(pairs, DOMAIN)
            if unknown:
                warnings.warn(Warnings.W001.format(count=len(unknown), examples=sorted(set(unknown))[:5]), stacklevel=2)
        self.searcher = self._new_searcher(kb)
        self.searcher.build(progress=progress)
        self.linker = self._new_linker()
        self.linker.build()

    def _new_searcher(self, kb: KnowledgeBase) -> SieveSearcher:
        cfg = self.cfg
        return SieveSearcher(kb, self.encoder, cfg["strategy"], cfg["threshold"], cfg["top_k"], cfg["index"])

    def set_strategy(self, strategy: str, threshold: float | None = None) -> None:
        """Change the sieve (and its threshold) of a ready component; no re-encoding is needed."""
        self._require_searcher()
        if threshold is not None:
            _check(_number_in(threshold, -1.0, 1.0), "threshold", "a cosine in [-1, 1]", threshold)
        self.searcher.strategy = strategy
        self.cfg["strategy"] = strategy
        if threshold is not None:
            self.searcher.threshold = self.cfg["threshold"] = threshold

    def add_synonyms(self, pairs: Iterable[tuple[str, str]]) -> list[str]:
        """Add domain synonyms, searched at once (no retraining). All or nothing: a bad item (ConceptNormError
        naming it) or a failure to encode the new names leaves the component as it was. A pair that is already a
        domain synonym is counted, so that `remove_synonyms` of it undoes this call and keeps the original.

        pairs (Iterable[Tuple[str, str]]): (text, concept id) pairs; the id may be any id of the concept.
        RETURNS (List[str]): Concept ids that are not in the knowledge base (those pairs were skipped).
        """
        kb = self._require_searcher().kb
        pairs = checked_pairs(pairs)
        restore = kb.saved_names(text for text, _ in pairs)
        new, unknown = kb.add_names(pairs, DOMAIN, repeats=True)
        try:
            self.searcher.add_names(new, DOMAIN)
        except BaseException:
            restore()
            raise
        self.linker.changed()
        return unknown

    def remove_synonyms(self, pairs: Iterable[tuple[str, str | None] | str]) -> None:
        """Remove domain synonyms at once. A concept id of None (or a bare text) removes the text for every
        concept. A pair added again by `add_synonyms` while it was already there loses that addition only. Every
        item is checked first: a bad one raises ConceptNormError naming it and changes nothing.

        pairs (Iterable[Union[Tuple[str, Optional[str]], str]]): (text, concept id or None) pairs, or texts.
        """
        kb = self._require_searcher().kb
        self.searcher.remove_names(kb.remove_names(checked_pairs(pairs, allow_none=True), DOMAIN, repeats=True), DOMAIN)
        self.linker.changed()

    @contextmanager
    def synonyms_hidden(self, pairs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
        """Take (normalized text, concept id) domain synonyms out for the duration, then put them back (to score
        mentions that are domain synonyms themselves). Yields the pairs that were taken out."""
        kb = self.kb
        hidden = sorted({(n, c) for n, c in pairs if c in kb.concepts_for(n, SOURCE_BITS[DOMAIN])})
        restore = kb.saved_names(n for n, _ in hidden)  # the repeat counts too
        self.searcher.remove_names(kb.remove_names(hidden, DOMAIN), DOMAIN)
        self.linker.changed()
        try:
            yield hidden
        finally:
            self.searcher.add_names(kb.add_names(hidden, DOMAIN)[0], DOMAIN)
            restore()
            self.linker.changed()

    # --- linking ------------------------------------------------------------------------------------------------
    def __call__(self, doc: Doc) -> Doc:
        return next(self.pipe([doc]))

    def _require_searcher(self) -> SieveSearcher:
        if self.searcher is None:
            raise ConceptNormError(Errors.E301.format(name=self.name))
        return self.searcher

    def pipe(self, stream: Iterable[Doc], *, batch_size: int | None = None) -> Iterator[Doc]:
        """Link the docs in batches; an error in a batch goes to the pipeline's error handler
        (`nlp.set_error_handler`), which raises by default, as in spaCy's own components."""
        error_handler = self.get_error_handler()
        for docs in minibatch(stream, size=batch_size or self.cfg["batch_size"]):
            try:
                self.set_annotations(docs, self.predict(docs))
                yield from docs
            except Exception as e:
                error_handler(self.name, self, docs, e)

    def entities_to_link(self, doc: Doc) -> list[Span]:
        """The entities of the doc that the component links: those with one of its `labels` (all when it has none).
        `predict` answers for these, in this order; the others are left as they are.

        doc (Doc): The document, its entities set.
        RETURNS (List[Span]): The entities to link, in document order.
        """
        labels = self.cfg["labels"]
        return [ent for ent in doc.ents if not labels or ent.label_ in labels]

    def queries(self, ent: Span) -> list[list[str]]:
        """What the component searches for an entity: per part, the texts to search (the mention and/or its long
        form, as `long_form` says). A composite split by `composite_splitter` is searched by its parts (when
        `split_composites`) even when its whole text is a known name: annotators link such texts both ways.

        ent (Span): The entity.
        RETURNS (List[List[str]]): Per part, the texts searched; one part for a mention that is not split.
        """
        parts = ent._.composite_parts if self.cfg["split_composites"] and ent.has_extension("composite_parts") else None
        if parts:
            return [[p[:MAX_MENTION_CHARS]] for p in parts]
        text = ent.text[:MAX_MENTION_CHARS]
        long = ent._.long_form if ent.has_extension("long_form") else None
        if isinstance(long, Span):  # scispacy's AbbreviationDetector sets the long form's Span
            long = long.text
        mode = self.cfg["long_form"]
        if not long or mode == "mention":
            return [[text]]
        return [[long[:MAX_MENTION_CHARS]]] if mode == "long" else [[text, long[:MAX_MENTION_CHARS]]]

    def predict(self, docs: Iterable[Doc]) -> list[list[list[tuple[str, Match]]]]:
        """Per doc, per linked entity, per part: the text searched and its Match (the more confident of the
        mention and its long form where both were searched). All entities of the batch are linked at once."""
        if self.linker is None:
            raise ConceptNormError(Errors.E301.format(name=self.name))
        docs = list(docs)
        layout = [[(ent, self.queries(ent)) for ent in self.entities_to_link(doc)] for doc in docs]
        texts, contexts = [], []
        with_context = self.linker.needs_context  # Doc.text joins every token: built only when a scorer reads it
        for doc, doc_q in zip(docs, layout):
            doc_text = doc.text if with_context and doc_q else ""
            for ent, ent_q in doc_q:
                context = mention_context(ent.text, doc_text, ent.start_char, ent.end_char) if with_context else ""
                for part_q in ent_q:
                    texts.extend(part_q)
                    contexts.extend(context for _ in part_q)
        found = iter(zip(texts, self.linker.link(texts, contexts)))
        return [
            [[max((next(found) for _ in part_q), key=_preference) for part_q in ent_q] for _, ent_q in doc_q]
            for doc_q in layout
        ]

    def set_annotations(self, docs: Iterable[Doc], predictions: list[list[list[tuple[str, Match]]]]) -> None:
        nil = self.cfg["nil_threshold"]
        for doc, doc_predictions in zip(docs, predictions):
            linked = dict(zip(self.entities_to_link(doc), doc_predictions))
            ents = []
            for ent in doc.ents:
                parts = linked.get(ent)
                if parts is None:
                    ents.append(ent)
                    continue
                records = [
                    {
                        "text": text,
                        "kb_id": m.candidates[0][0] if m.candidates and m.confidence >= nil else NIL,
                        "candidates": m.candidates,
                        "name": m.names[0] if m.names else None,
                        "stage": m.stage,
                        "confidence": m.confidence,
                    }
                    for text, m in parts
                ]
                kb_id = "|".join(r["kb_id"] for r in records)
                new = Span(doc, ent.start, ent.end, label=ent.label, kb_id=kb_id, span_id=ent.id)
                ents.append(new)
                new._.kb_parts = records
                new._.kb_ents = records[0]["candidates"] if len(records) == 1 else merged_candidates(records)
                new._.kb_name = "|".join(r["name"] or "" for r in records)
                new._.kb_stage = "|".join(r["stage"] or "" for r in records)
                new._.kb_confidence = min(r["confidence"] for r in records)
            doc.ents = ents
            if self.cfg["consistency"]:
                make_consistent(doc, [e for e in doc.ents if e in linked], self.kb.normalizer, nil)

    def score(self, examples: Iterable[Example], **kwargs: Any) -> dict[str, float]:
        """Score linking (`nlp.evaluate` calls it): the configured scorer's figures (kb_acc, kb_acc5, kb_found),
        and spaCy's `nel_micro_p/r/f` from `Scorer.score_links`, which compares ids as strings with "NIL" as no
        link (kb_acc also accepts any other id of the gold concept).

        examples (Iterable[Example]): Predicted docs with their gold references.
        RETURNS (Dict[str, float]): The scores.
        """
        kb = self._require_searcher().kb
        examples = list(examples)
        scores = self.scorer(examples, kb=kb, **kwargs) if self.scorer is not None else {}
        links = Scorer.score_links(examples, negative_labels=[NIL])
        return {**scores, **{key: links[key] for key in NEL_KEYS}}

    # --- serialization ------------------------------------------------------------------------------------------
    def _saves_encoder(self) -> bool:
        """Weights from a local directory travel with the pipeline; the packaged default and hub ids are
        stored by reference."""
        return self.encoder.reference != PACKAGED_MODEL and Path(self.encoder.reference).is_dir()

    def _writers(self) -> dict[str, Callable[[Path], None]]:
        """The saved parts: cfg (with the encoder's reference), the knowledge base, the name vectors and indexes
        (with their checksum), and the second stage (`Linker.to_disk`)."""
        self._require_searcher()
        return {
            "cfg": lambda p: write_json(p, {**self.cfg, "encoder": self.encoder.config(), "checksums": True}),
            "kb": lambda p: self.kb.to_disk(p),
            "searcher": lambda p: self.searcher.to_disk(p),
            "linker": lambda p: self.linker.to_disk(p),
        }

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> None:
        """Write the parts, the encoder's weights when they come from a local directory, and `checksums.json`,
        the sha256 of every file written, which loading checks. `spacy.load` then gives identical predictions
        with no re-encoding.

        path (Union[str, Path]): The component's directory.
        exclude (Iterable[str]): Parts not to write ("cfg", "kb", "searcher", "linker", "encoder").
        """
        writers = self._writers()
        if self._saves_encoder():
            writers["encoder"] = lambda p: write_dir_atomically(p, self.encoder.save)
        to_disk(path, writers, exclude)
        write_checksums(path)

    def to_bytes(self, *, exclude: Iterable[str] = SimpleFrozenList()) -> bytes:
        """The files `to_disk` writes, as msgpack {relative path: content}, for `nlp.to_bytes()`: `from_bytes`
        writes them back and loads them as `from_disk` does, with its checks. The encoder travels by reference
        (its config): a local model directory must still be there for `from_bytes`.

        exclude (Iterable[str]): Parts to leave out ("cfg", "kb", "searcher", "linker").
        RETURNS (bytes): The serialized component.
        """
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "part"
            self.to_disk(root, exclude=[*exclude, "encoder"])
            files = sorted(p for p in root.rglob("*") if p.is_file())
            return srsly.msgpack_dumps({p.relative_to(root).as_posix(): p.read_bytes() for p in files})

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> "ConceptNormalizer":
        """Load what `to_disk` wrote, after checking every file against `checksums.json` (ConceptNormError naming
        a file that is missing or differs; set SPACY_CONCEPTNORM_SKIP_CHECKSUMS=1 to skip the check).

        path (Union[str, Path]): The component's directory.
        exclude (Iterable[str]): Parts not to read: the component keeps its own (see `_load`).
        RETURNS (ConceptNormalizer): The component.
        """
        path = Path(path)
        if "cfg" not in exclude and not (path / "cfg").exists():
            detail = f"no cfg file, {path / 'cfg'} not found (was the pipeline saved?)"
            raise ConceptNormError(Errors.E302.format(path=path, detail=detail))
        files = read_checksums(path)
        if files is not None:
            # the searcher checks its vectors and index files against the crc32s in its searcher.msgpack (which is
            # checked here): hashing them twice took half the time of loading the component
            own = [name for name in files if name.startswith("searcher/") and name.endswith((".npy", ".faiss"))]
            check_files(path, files, skip=[*exclude, *own])
        elif not checksums_skipped() and "cfg" not in exclude and read_json(path / "cfg").get("checksums"):
            raise ConceptNormError(Errors.E981.format(path=path, manifest=path / CHECKSUMS, problem="missing"))
        return self._load(lambda readers: from_disk(path, readers, exclude))

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = SimpleFrozenList()) -> "ConceptNormalizer":
        """Load what `to_bytes` wrote: the files are written to a temporary directory and loaded by `from_disk`,
        with its checks; errors name the file as "<bytes>/name".

        bytes_data (bytes): The data.
        exclude (Iterable[str]): Parts not to read: the component keeps its own (see `_load`).
        RETURNS (ConceptNormalizer): The component.
        """
        try:
            files = srsly.msgpack_loads(bytes_data)
        except Exception as e:  # msgpack raises several unrelated types on bad data
            raise ConceptNormError(Errors.E004.format(path="concept_normalizer bytes", detail=repr(e))) from None
        if not isinstance(files, dict) or ("cfg" not in exclude and "cfg" not in files):
            raise ConceptNormError(Errors.E302.format(path="bytes", detail="no cfg (not a concept_normalizer)"))
        if not all(_is_packed_file(name, content) for name, content in files.items()):
            raise ConceptNormError(Errors.E004.format(path="concept_normalizer bytes", detail="not packed files"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "bytes"
            for name, content in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(content)
            try:
                return self.from_disk(root, exclude=exclude)
            except ConceptNormError as e:
                raise ConceptNormError(str(e).replace(str(root), "<bytes>")) from None

    def _load(self, read: Callable[[dict[str, Callable[[Path], None]]], Any]) -> "ConceptNormalizer":
        """Call `read` with the readers of the saved parts, in the order the parts depend on each other. A part it
        leaves out (`exclude`) stays as it was, except that a KB read without its vectors is encoded, and a search
        read without its linker gets an untrained one."""
        new_kb: list[KnowledgeBase] = []

        def searcher() -> SieveSearcher:
            if new_kb:  # the KB was read and its vectors were not: encode its names
                self.searcher, self.linker = self._new_searcher(new_kb.pop()), None
                self.searcher.build()
            return self._require_searcher()

        def read_searcher(path: Path) -> None:
            self.searcher = self._new_searcher(new_kb.pop() if new_kb else self.kb).from_disk(path)
            self.linker = None

        def read_linker(path: Path) -> None:
            searcher()
            self.linker = self._new_linker().from_disk(path)

        read({
            "cfg": self._read_cfg,
            "encoder": self._read_encoder,
            "kb": lambda path: new_kb.append(KnowledgeBase.from_disk(path)),
            "searcher": read_searcher,
            "linker": read_linker,
        })  # fmt: skip
        if new_kb or self.searcher is not None:
            searcher()
            if self.linker is None:
                self.linker = self._new_linker()
                self.linker.build()
        return self

    def _read_cfg(self, path: Path) -> None:
        """Read the settings. The encoder built from the config is kept when the saved one has the same settings,
        else the saved one is built (it encoded the name vectors)."""
        cfg = read_json(path)
        cfg.pop("checksums", None)
        saved = cfg.pop("encoder", None)
        self.cfg.update(cfg)
        if saved and saved != self.encoder.config():
            self.encoder = _encoder_like(self.encoder, saved)

    def _read_encoder(self, path: Path) -> None:
        """Weights saved with the pipeline (from a local directory at save time) replace the configured ones."""
        if path.is_dir():
            self.encoder = _encoder_like(self.encoder, {**self.encoder.config(), "model": str(path)})


def _encoder_like(encoder: Any, config: dict) -> Any:
    """An encoder of the same kind as `encoder` built from a saved `config`: an encoder with its own directory
    format (a `load` class method, e.g. BNE) loads its "model" directory, a transformer is built anew on the
    configured device and runtime (how it runs, not which vectors it gives). Nothing is loaded until it encodes."""
    if hasattr(type(encoder), "load"):
        return type(encoder).load(config["model"])
    runtime = getattr(encoder, "runtime", "torch")
    return NameEncoder(**config, device=getattr(encoder, "device", None), runtime=runtime)


def _check(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConceptNormError(Errors.E304.format(key=key, expected=expected, value=value))


def _number_in(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def _int_from(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_index(index: Any) -> None:
    """Raise ConceptNormError for index settings `VectorIndex` cannot take."""
    _check(isinstance(index, dict), "index", "a table of index settings", index)
    unknown = sorted(set(index) - set(INDEX_SETTINGS))
    if unknown:
        raise ConceptNormError(Errors.E305.format(keys=unknown, choices=INDEX_SETTINGS))
    if index.get("index_type", "auto") not in INDEX_TYPES:
        raise ConceptNormError(Errors.E103.format(index_type=index["index_type"], choices=INDEX_TYPES))
    for key in set(index) - {"index_type"}:
        low = 0 if key == "ivf_nlist" else 1  # 0 lists: chosen from the number of names
        _check(_int_from(index[key], low), f"index.{key}", f"an integer >= {low}", index[key])


def _is_packed_file(name: Any, content: Any) -> bool:
    """A relative path inside the component's directory with its bytes (what `to_bytes` packs)."""
    if not (isinstance(name, str) and isinstance(content, bytes)):
        return False
    path = Path(name)
    return bool(path.parts) and ".." not in path.parts and not path.is_absolute()


def _preference(found: tuple[str, Match]) -> tuple[float, float]:
    """Of a mention and its long form, the more confident answer; ties (an uncalibrated confidence is the top
    score clipped to 1, and exact matches of both reach it) go to the higher raw score, as the sieve ranks, both
    rounded as the sieve rounds so that float noise (two exact matches at 1 +- 1e-7) is a tie, which `max` gives
    to the mention, searched first."""
    match = found[1]
    return (round(match.confidence, 6), round(match.score, 5))


def mention_context(mention: str, text: str, start: int, end: int) -> str:
    """A mention in a window of its document's text, marked with brackets: "... left [mention] right ...", with
    up to `CONTEXT_CHARS` characters each side. It is what the ranker's context-aware pair scorers read, in
    linking, in training (`train-ranker`) and in curation, so all three must build it here.

    mention (str): The mention text.
    text (str): The text of its document ("" gives the mention alone, in brackets).
    start (int): The mention's first character in `text`.
    end (int): The character offset just after the mention in `text`.
    RETURNS (str): The mention in its context.
    """
    return f"{text[max(0, start - CONTEXT_CHARS) : start]}[{mention}]{text[end : end + CONTEXT_CHARS]}"


def merged_candidates(records: list[dict]) -> list[tuple[str, float]]:
    """The candidates of a composite's parts in one list, best score first (scispacy's `kb_ents` shape); each
    part's own list stays in `kb_parts`."""
    best: dict[str, float] = {}
    for record in records:
        for cid, score in record["candidates"]:
            best[cid] = max(score, best.get(cid, float("-inf")))
    return sorted(best.items(), key=lambda cs: (-cs[1], cs[0]))
