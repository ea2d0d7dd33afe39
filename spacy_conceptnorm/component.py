"""The `concept_normalizer` pipeline component: links `doc.ents` to knowledge-base concepts.

For each entity it sets
- `ent.kb_id_`: the best concept id; parts of a composite joined by "|" in text order; "NIL" when the best score
  confidence is under `nil_threshold` (or the mention is empty);
- `ent._.kb_ents`: [(concept_id, score), ...] best first, scispacy's shape (ranker probabilities when the ranker
  answered, else cosines); for a composite, the parts' candidates merged (per part in `kb_parts`);
- `ent._.kb_confidence`: the probability that `kb_id_` is right (calibrated on dev by `calibrate`; the lowest
  part's for a composite); `kb_id_` is "NIL" when it is under `nil_threshold`;
- `ent._.kb_name`, `ent._.kb_stage`: the name that matched and the sieve stage that answered ("|"-joined parts);
- `ent._.kb_parts`: per part, {"text", "kb_id", "candidates", "name", "stage"}.
Values live in `doc.user_data`, so they survive DocBin (store_user_data=True) and `nlp.pipe(n_process=...)`.
"""

import json
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.training import Example
from spacy.util import SimpleFrozenList, minibatch, to_disk

from .consistency import make_consistent
from .encoder import PACKAGED_MODEL, NameEncoder
from .errors import ConceptNormError, Errors, Warnings
from .kb import DOMAIN, SOURCE_BITS, KnowledgeBase
from .ranking.lexical import LexicalIndex
from .ranking.linker import Linker
from .ranking.ranker import Ranker
from .scoring import NIL, gold_ids, score_linking
from .search import Match, SieveSearcher
from .util import atomic_open, read_json, write_dir_atomically, write_json

MAX_MENTION_CHARS = 1000  # longer entities are cut before normalization; names are at most ~25 tokens anyway
LONG_FORM_MODES = ("best", "long", "mention")

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
    "index": {"index_type": "exact"},
    "long_form": "best",
    "split_composites": True,
    "ranker": {"@misc": "spacy_conceptnorm.ranker.v1"},
    "consistency": True,
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
    scorer: Callable | None,
) -> "ConceptNormalizer":
    return ConceptNormalizer(
        nlp.vocab,
        encoder,
        name=name,
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
        scorer=scorer,
    )


class ConceptNormalizer(Pipe):
    """Link entities to concepts with a sieve search over name vectors.

    vocab (Vocab): The shared vocabulary.
    encoder (NameEncoder): Encodes names and mentions (any transformers model; default all-MiniLM-L6-v2).
    name (str): The component instance name.
    strategy (str): Sieve stages joined by "+", each TARGET-REPR with TARGET in O, D, OD and REPR in T, C.
    threshold (float): A stage before the last answers only when its best cosine reaches this.
    top_k (int): Candidates kept per entity in `ent._.kb_ents`.
    nil_threshold (float): Links whose confidence is under this give `kb_id_` "NIL".
    labels (List[str]): Entity labels to link; empty links all.
    batch_size (int): Docs gathered per search in `pipe`.
    index (dict): Vector index settings: `index_type` ("exact", "flat", "hnsw", "ivf") and its parameters.
    long_form (str): With `abbreviation_resolver` before it: "best" searches the mention and its long form and
        keeps the better score, "long" the long form only, "mention" ignores long forms.
    split_composites (bool): With `composite_splitter` before it, link each part of a composite mention.
    ranker (Optional[Ranker]): The second stage over the sieve's and lexical candidates (trained by
        `spacy_conceptnorm train-ranker`; until then the sieve's answer stands). None: the sieve alone.
    consistency (bool): One normalized mention text gets one concept within a document unless the linker is
        confident otherwise, and an undefined abbreviation takes the concept of the entity it abbreviates.
    scorer (Optional[Callable]): Scores linking accuracy for `nlp.evaluate`.
    """

    def __init__(
        self,
        vocab,
        encoder: NameEncoder,
        *,
        name: str = "concept_normalizer",
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
        scorer: Callable | None = score_linking,
    ) -> None:
        if long_form not in LONG_FORM_MODES:
            raise ConceptNormError(f"long_form must be one of {LONG_FORM_MODES}, got {long_form!r}")
        self.vocab = vocab
        self.name = name
        self.encoder = encoder
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
        SieveSearcher.validate(strategy, top_k)

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
        self.linker = Linker(self.searcher, self.ranker)
        self.linker.build()

    def _new_searcher(self, kb: KnowledgeBase) -> SieveSearcher:
        cfg = self.cfg
        return SieveSearcher(kb, self.encoder, cfg["strategy"], cfg["threshold"], cfg["top_k"], cfg["index"])

    def set_strategy(self, strategy: str, threshold: float | None = None) -> None:
        """Change the sieve (and its threshold) of a ready component; no re-encoding is needed."""
        self._require_searcher()
        self.searcher.strategy = strategy
        self.cfg["strategy"] = strategy
        if threshold is not None:
            self.searcher.threshold = self.cfg["threshold"] = threshold

    def add_synonyms(self, pairs: Iterable[tuple[str, str]]) -> list[str]:
        """Add domain synonyms, searched at once (no retraining).

        pairs (Iterable[Tuple[str, str]]): (text, concept id) pairs; the id may be any id of the concept.
        RETURNS (List[str]): Concept ids that are not in the knowledge base (those pairs were skipped).
        """
        new, unknown = self.kb.add_names(pairs, DOMAIN)
        self.searcher.add_names(new, DOMAIN)
        self.linker.changed()
        return unknown

    def remove_synonyms(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """Remove domain synonyms at once. A concept id of None removes the text for every concept."""
        self._require_searcher()
        pairs = [p if isinstance(p, (tuple, list)) else (p, None) for p in pairs]
        self.searcher.remove_names(self.kb.remove_names(pairs, DOMAIN), DOMAIN)
        self.linker.changed()

    @contextmanager
    def synonyms_hidden(self, pairs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
        """Take (normalized text, concept id) domain synonyms out for the duration, then put them back (to score
        mentions that are domain synonyms themselves). Yields the pairs that were taken out."""
        kb = self.kb
        hidden = sorted({(n, c) for n, c in pairs if c in kb.concepts_for(n, SOURCE_BITS[DOMAIN])})
        self.remove_synonyms(hidden)
        try:
            yield hidden
        finally:
            self.add_synonyms(hidden)

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

    def _entities(self, doc: Doc) -> list[Span]:
        labels = self.cfg["labels"]
        return [ent for ent in doc.ents if not labels or ent.label_ in labels]

    def _queries(self, ent: Span) -> list[list[str]]:
        """Per part of the entity, the texts to search (the mention and/or its long form). (Searching a composite
        whole when its text is a known name was measured on dev: 7 errors fewer, 8 more, as annotators link the
        same text both ways.)"""
        parts = ent._.composite_parts if self.cfg["split_composites"] and ent.has_extension("composite_parts") else None
        if parts:
            return [[p[:MAX_MENTION_CHARS]] for p in parts]
        text = ent.text[:MAX_MENTION_CHARS]
        long = ent._.long_form if ent.has_extension("long_form") else None
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
        layout = [[(ent, self._queries(ent)) for ent in self._entities(doc)] for doc in docs]
        texts, contexts = [], []
        for doc_q in layout:
            for ent, ent_q in doc_q:
                context = _context(ent)
                for part_q in ent_q:
                    texts.extend(part_q)
                    contexts.extend(context for _ in part_q)
        found = iter(zip(texts, self.linker.link(texts, contexts)))
        return [
            [
                [max((next(found) for _ in part_q), key=_preference) for part_q in ent_q]
                for _, ent_q in doc_q
            ]
            for doc_q in layout
        ]

    def set_annotations(self, docs: Iterable[Doc], predictions: list[list[list[tuple[str, Match]]]]) -> None:
        nil = self.cfg["nil_threshold"]
        for doc, doc_predictions in zip(docs, predictions):
            linked = dict(zip(self._entities(doc), doc_predictions))
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

    def score(self, examples: Iterable[Example], **kwargs) -> dict[str, float]:
        return self.scorer(examples, kb=self._require_searcher().kb, **kwargs)

    # --- serialization ------------------------------------------------------------------------------------------
    def _saves_encoder(self) -> bool:
        """Weights from a local directory travel with the pipeline; the packaged default and hub ids are
        stored by reference."""
        return self.encoder.reference != PACKAGED_MODEL and Path(self.encoder.reference).is_dir()

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> None:
        """Write cfg, the knowledge base, the name vectors and indexes, and the encoder's weights when they
        come from a local directory. `spacy.load` then gives identical predictions with no re-encoding."""
        if self.searcher is None:
            raise ConceptNormError(Errors.E301.format(name=self.name))
        serialize = {
            "cfg": lambda p: write_json(p, {**self.cfg, "encoder": self.encoder.config()}),
            "kb": lambda p: self.kb.to_disk(p),
            "searcher": lambda p: self.searcher.to_disk(p),
            "linker": lambda p: write_dir_atomically(p, self._write_linker),
        }
        if self._saves_encoder():
            serialize["encoder"] = lambda p: write_dir_atomically(p, self.encoder.save)
        to_disk(path, serialize, exclude)

    def _write_linker(self, path: Path) -> None:
        """The second stage: ranker weights, confidence model, lexical index and trained pair scorers."""
        linker = self.linker
        write_json(path / "models.json", {
            "ranker": linker.ranker.weights_to_dict() if linker.ranker else None,
            "counts": linker.ranker.counts if linker.ranker else {},
            "confidence": linker.confidence.to_dict(),
        })  # fmt: skip
        if linker.generator is not None:
            with atomic_open(path / "lexical.msgpack") as f:
                f.write(linker.generator.lexical.to_bytes())
        for name, scorer in linker.ranker.scorers.items() if linker.ranker else ():
            scorer.to_disk(path / "scorers" / name)

    def _read_linker(self, path: Path) -> Linker:
        linker = Linker(self.searcher, self.ranker)
        if not (path / "models.json").exists():  # saved before the ranker existed: nothing trained yet
            linker.build()
            return linker
        models = read_json(path / "models.json")
        linker.confidence.from_dict(models.get("confidence") or {})
        if linker.ranker is not None:
            linker.ranker.weights_from_dict(models.get("ranker"), path / "models.json")
            linker.ranker.counts = linker.generator.counts = {
                str(k): int(v) for k, v in models.get("counts", {}).items()
            }
            if (path / "lexical.msgpack").exists():
                linker.generator.lexical = LexicalIndex().from_bytes((path / "lexical.msgpack").read_bytes())
                linker.generator.sync()
            else:
                linker.generator.build()
            for name, scorer in linker.ranker.scorers.items():
                if (path / "scorers" / name).exists():
                    scorer.from_disk(path / "scorers" / name)
        return linker

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> "ConceptNormalizer":
        path = Path(path)
        if not (path / "cfg").exists():
            raise ConceptNormError(Errors.E302.format(path=path, detail="no cfg file (was the pipeline saved?)"))
        try:
            cfg = json.loads((path / "cfg").read_text(encoding="utf8"))
        except ValueError as e:
            raise ConceptNormError(Errors.E004.format(path=path / "cfg", detail=e)) from None
        encoder_cfg = cfg.pop("encoder", {})
        self.cfg.update(cfg)
        if (path / "encoder").is_dir():
            encoder_cfg["model"] = str(path / "encoder")
        if encoder_cfg:
            self.encoder = NameEncoder(**encoder_cfg, device=self.encoder.device)
        kb = KnowledgeBase.from_disk(path / "kb")
        self.searcher = self._new_searcher(kb).from_disk(path / "searcher")
        self.linker = self._read_linker(path / "linker")
        return self


def _preference(found: tuple[str, Match]) -> tuple[float, float]:
    """Of a mention and its long form, the more confident answer; ties (an uncalibrated confidence is the top
    score clipped to 1, and exact matches of both reach it) go to the higher raw score, as the sieve ranks."""
    match = found[1]
    return (match.confidence, match.score)


def _context(ent: Span) -> str:
    """The mention in a window of its document, marked with brackets: "... left [mention] right ..."."""
    text = ent.doc.text
    left = text[max(0, ent.start_char - CONTEXT_CHARS) : ent.start_char]
    right = text[ent.end_char : ent.end_char + CONTEXT_CHARS]
    return f"{left}[{ent.text}]{right}"


def merged_candidates(records: list[dict]) -> list[tuple[str, float]]:
    """The candidates of a composite's parts in one list, best score first (scispacy's `kb_ents` shape); each
    part's own list stays in `kb_parts`."""
    best: dict[str, float] = {}
    for record in records:
        for cid, score in record["candidates"]:
            best[cid] = max(score, best.get(cid, float("-inf")))
    return sorted(best.items(), key=lambda cs: (-cs[1], cs[0]))
