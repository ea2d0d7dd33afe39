"""The linker: the sieve's candidates, re-ranked, with a calibrated confidence per answer.

    queries -> sieve (dense top-k) -> CandidateGenerator (+ lexical, features) -> Ranker -> Confidence

Without a ranker that reorders (none, not trained yet, or `Ranker.reorder` off because `train-ranker` found that it
ranks dev mentions no better than the sieve) the sieve's answer stands: no candidate sets are built, and the lexical
index they need is neither built, saved nor loaded. The confidence is the top cosine until the confidence model is
fitted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from spacy.util import SimpleFrozenList, from_disk, to_disk

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open, read_json, write_dir_atomically, write_json
from ..search.sieve import Match, SieveSearcher
from .candidates import CandidateGenerator, CandidateSet
from .confidence import Confidence
from .lexical import LexicalIndex
from .pair_scorer import PairScorer
from .ranker import Ranker, sieve_evidence

MODELS, LEXICAL = "models.json", "lexical.msgpack"


class Linker:
    """Links mention texts: the sieve's answer, re-ranked when the ranker reorders, with the evidence
    the confidence model reads; answers are remembered across calls.

    searcher (SieveSearcher): The built sieve.
    ranker (Optional[Ranker]): The second stage.
    confidence (Optional[Confidence]): Maps evidence to the probability that a link is right (default: unfitted).
    cache_size (int): Normalized texts whose answers are remembered (least recently linked dropped first; 0: none).
    """

    def __init__(
        self,
        searcher: SieveSearcher,
        ranker: Ranker | None = None,
        confidence: Confidence | None = None,
        cache_size: int = 100_000,
    ) -> None:
        self.searcher = searcher
        self.ranker = ranker
        self.confidence = confidence or Confidence()
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Match] = OrderedDict()
        self._cache_state: tuple | None = None
        self.cache_hits = self.cache_lookups = 0
        self._name_counts: np.ndarray | None = None  # names per concept index, counted when first needed
        self.generator: CandidateGenerator | None = None  # built on first need: `candidate_generator`

    @property
    def needs_context(self) -> bool:
        """Whether `link` reads the mentions' contexts (only pair scorers do)."""
        return self.ranker is not None and bool(self.ranker.scorers)

    @property
    def reorders(self) -> bool:
        """Whether linking takes the ranker's order, and so reads candidate sets and the lexical index."""
        return self.ranker is not None and self.ranker.is_fitted and self.ranker.reorder

    def build(self) -> None:
        """Build what linking reads besides the searcher: the lexical index when the ranker reorders."""
        if self.reorders:
            self.candidate_generator()

    def candidate_generator(self, lexical: LexicalIndex | None = None) -> CandidateGenerator:
        """The candidate generator (the ranker's settings and counts), its lexical index fitted on the searcher's
        names at the first call unless `lexical` (fitted on the searcher's rows) is given; needs a ranker."""
        if self.generator is None or lexical is not None:
            generator = CandidateGenerator(self.searcher, self.ranker.lexical_k, ngram_range=self.ranker.ngram_range)
            generator.counts = self.ranker.counts
            if lexical is None:
                generator.build()
            else:
                generator.lexical = lexical
                generator.sync()
            self.generator = generator
        return self.generator

    def changed(self) -> None:
        """The searcher's names changed (synonyms added or removed)."""
        self._cache.clear()
        self._name_counts = None
        if self.generator is not None:
            self.generator.sync()

    # --- the answer cache ---------------------------------------------------------------------------------------
    def resize(self, cache_size: int) -> None:
        """Remember at most `cache_size` answers from now on (the least recently linked go first; 0: none)."""
        self.cache_size = cache_size
        while len(self._cache) > cache_size:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        """Forget every remembered answer (the hit counts stay)."""
        self._cache.clear()

    def cache_info(self) -> dict[str, int]:
        """{"hits", "lookups" (distinct texts per call looked up), "size", "max_size"}, counted since creation."""
        return {"hits": self.cache_hits, "lookups": self.cache_lookups, "size": len(self._cache),
                "max_size": self.cache_size}  # fmt: skip

    def _state(self) -> tuple:
        """What a cached answer depends on besides the names (whose changes clear the cache): the sieve's settings
        and the ranker's, its weights and counts by value, so that a change made in place is seen too."""
        s, r = self.searcher, self.ranker
        ranker = None
        if r is not None:
            weights = None if r.weights is None else tuple((k, np.asarray(v).tobytes()) for k, v in r.weights.items())
            ranker = (r.reorder, r.fast_path, weights, dict(r.counts), r.dense_k, r.lexical_k, r.model)
        return (s.strategy, s.threshold, s.top_k, s.hidden, ranker)

    # --- serialization ------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> None:
        """Write directory `path`, swapped in whole once written: `models.json` (the ranker's weights and counts,
        the confidence model), `lexical.msgpack` (the lexical index, only while the ranker reorders) and each
        trained pair scorer's directory (`scorer_paths`).

        path (Union[str, Path]): The directory.
        exclude (Iterable[str]): Files or directories not to write, named as above without the extension.
        """
        write_dir_atomically(path, lambda tmp: to_disk(tmp, self._writers(), exclude))

    def _writers(self) -> dict[str, Callable[[Path], None]]:
        ranker = self.ranker
        models = {
            "ranker": ranker.weights_to_dict() if ranker else None,
            "counts": ranker.counts if ranker else {},
            "confidence": self.confidence.to_dict(),
        }
        writers: dict[str, Callable[[Path], None]] = {MODELS: lambda p: write_json(p, models)}
        if self.reorders:
            writers[LEXICAL] = self._write_lexical
        writers.update((where, scorer.to_disk) for where, scorer in scorer_paths(ranker).items())
        return writers

    def _write_lexical(self, path: Path) -> None:
        with atomic_open(path) as f:
            f.write(self.candidate_generator().lexical.to_bytes())

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> Linker:
        """Load what `to_disk` wrote into this linker's ranker and confidence model; a missing or damaged file
        raises ConceptNormError naming it. The lexical index is read only when the loaded ranker reorders.

        path (Union[str, Path]): The directory.
        exclude (Iterable[str]): Files or directories not to read, named as in `to_disk`.
        RETURNS (Linker): The linker.
        """
        readers: dict[str, Callable[[Path], None]] = {MODELS: self._read_models, LEXICAL: self._read_lexical}
        for where, scorer in scorer_paths(self.ranker).items():
            readers[where] = lambda p, scorer=scorer: scorer.from_disk(p) if p.exists() else None  # untrained
        self.generator = None
        from_disk(path, readers, exclude)
        self._cache.clear()
        self._name_counts = None
        return self

    def _read_models(self, path: Path) -> None:
        models = read_json(path)
        self.confidence.from_dict(models.get("confidence") or {}, path)
        if self.ranker is not None:
            try:
                counts = {str(k): int(v) for k, v in (models.get("counts") or {}).items()}
            except (AttributeError, TypeError, ValueError) as e:
                raise ConceptNormError(Errors.E004.format(path=path, detail=f"ranker counts: {e}")) from None
            self.ranker.weights_from_dict(models.get("ranker"), path)
            self.ranker.counts = counts

    def _read_lexical(self, path: Path) -> None:
        if not self.reorders:  # not read by linking; `candidate_generator` fits one if training asks
            return
        if not path.is_file():
            raise ConceptNormError(Errors.E302.format(path=path.parent, detail=f"the ranker reorders: {path} needed"))
        try:
            lexical = LexicalIndex().from_bytes(path.read_bytes())
        except Exception as e:  # msgpack, numpy and scipy raise several types on a damaged file
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
        self.candidate_generator(lexical)

    def candidate_sets(self, keys: Sequence[str]) -> list[CandidateSet]:
        """Candidate sets of distinct normalized queries (for training and inspection)."""
        generator = self.candidate_generator()
        vectors = self.searcher.query_vectors(keys)
        found = self.searcher.search_keys(keys, top_k=self.ranker.dense_k, vectors=vectors)
        return generator.generate(keys, [found[k] for k in keys], vectors)

    def link(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[Match]:
        """One Match per text, with `confidence` set. Each distinct normalized text is linked once (with the
        context of its first occurrence)."""
        keys = [self.searcher.kb.normalizer(t) for t in texts]
        first = {}
        for i, key in enumerate(keys):
            if key:
                first.setdefault(key, i)
        state = self._state()
        if state != self._cache_state:
            self._cache.clear()
            self._cache_state = state
        cacheable = not self.needs_context  # an answer read from the context is not the text's alone
        answers: dict[str, Match] = {}
        if cacheable:
            for key in first:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    answers[key] = hit
            self.cache_lookups += len(first)
            self.cache_hits += len(answers)
        unique = [k for k in first if k not in answers]
        kb = self.searcher.kb
        ranked = self.reorders
        # known names keep the sieve's answer when the ranker's fast path is on: no candidate sets for them
        hidden = self.searcher.hidden  # a held-out concept's names are no known names (NIL calibration)
        known = {k for k in unique if any(c not in hidden for c in kb.concepts_for(k))}
        sieve_only = [k for k in unique if not ranked or (self.ranker.fast_path and k in known)]
        found = self.searcher.search_keys(sieve_only)
        answers.update((k, sieve_evidence(found[k], k, k in known)) for k in sieve_only)
        rest = [k for k in unique if k not in answers]
        if rest:
            sets = self.candidate_sets(rest)
            mentions = [texts[first[k]] for k in rest]
            ctx = [contexts[first[k]] if contexts else "" for k in rest]
            answers.update(zip(rest, self.ranker.rerank(sets, mentions, ctx, self.searcher.top_k)))
        self._add_answer_evidence(unique, [answers[k] for k in unique])
        if cacheable:
            for key in unique:
                self._cache[key] = answers[key]
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        matches = [_copy(answers[k]) for k in first]  # callers may change a Match; the cached one stays
        for match, prob in zip(matches, self.confidence([m.evidence for m in matches])):
            match.confidence = float(prob)
        linked = dict(zip(first, matches))
        return [linked.get(k, Match(confidence=0.0)) for k in keys]

    def _add_answer_evidence(self, keys: Sequence[str], matches: Sequence[Match]) -> None:
        """Add to the evidence of each match what depends on its answer, 0 when the mention (its normalized text
        in `keys`) is a known name: `count_prior`, log(1 + the answering concept's annotated training mentions,
        the ranker's counts; 0 without a ranker); `names`, log(1 + its names in the KB); and `pair_score`, the
        ranker's trained `confidence_scorer`'s score of the mention and the answering name (0 without one).
        A known name needs no prior, and two known names (a mention and its long form) are then still told
        apart by their own evidence, not by which concept is the more frequent."""
        kb = self.searcher.kb
        counts = self.ranker.counts if self.ranker is not None else {}
        scorer = self.ranker.confidence_scorer if self.ranker is not None and self.ranker.is_fitted else None
        asked = []
        for key, match in zip(keys, matches):
            if not (match.evidence and match.candidates):
                continue
            annotated = names = 0
            if not match.evidence["exact"]:
                top = match.candidates[0][0]
                index = kb.concepts.index(top)
                annotated = counts.get(top, 0)
                names = self._names_per_concept()[index] if index >= 0 else 0
                asked.append((key, match))
            match.evidence["count_prior"] = float(np.log1p(annotated))
            match.evidence["names"] = float(np.log1p(names))
            if scorer is not None:
                match.evidence["pair_score"] = 0.0
        if scorer is not None and asked:
            scores = scorer.score([k for k, _ in asked], [[m.names[0] if m.names else ""] for _, m in asked])
            for (_, match), score in zip(asked, scores):
                match.evidence["pair_score"] = float(score[0])

    def _names_per_concept(self) -> np.ndarray:
        """The KB's names per concept index, counted from its link arrays once after each change of names."""
        if self._name_counts is None:
            kb = self.searcher.kb
            self._name_counts = np.bincount(kb.links()[1], minlength=len(kb))
        return self._name_counts


def _copy(match: Match) -> Match:
    return Match(list(match.candidates), list(match.names), match.stage, dict(match.evidence), match.confidence)


def scorer_paths(ranker: Ranker | None) -> dict[str, PairScorer]:
    """Where each trained pair scorer of the ranker is saved in the linker's directory: the columns' under
    "scorers/NAME", the confidence scorer under "confidence_scorer"."""
    if ranker is None:
        return {}
    paths = {f"scorers/{name}": scorer for name, scorer in ranker.scorers.items()}
    if ranker.confidence_scorer is not None:
        paths["confidence_scorer"] = ranker.confidence_scorer
    return paths
