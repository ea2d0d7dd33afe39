"""The linker: the sieve's candidates, re-ranked, with a calibrated confidence per answer.

    queries -> sieve (dense top-k) -> CandidateGenerator (+ lexical, features) -> Ranker -> Confidence

Without a ranker (before it is trained, or when `train-ranker` found that it ranks dev mentions worse than the
sieve: `Ranker.reorder` off) the sieve's answer stands, with no candidate sets built, and its confidence is the
top cosine until the confidence model is fitted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..search import Match, SieveSearcher
from .candidates import CandidateGenerator, CandidateSet
from .confidence import Confidence
from .ranker import Ranker, sieve_evidence


class Linker:
    """searcher (SieveSearcher): The built sieve. ranker (Optional[Ranker]): The second stage.
    confidence (Confidence): Maps evidence to the probability that a link is right."""

    cache_size = 100_000  # linked texts remembered across batches (corpora repeat their mentions heavily)

    def __init__(self, searcher: SieveSearcher, ranker: Ranker | None = None, confidence: Confidence | None = None):
        self.searcher = searcher
        self.ranker = ranker
        self.confidence = confidence or Confidence()
        self._cache: OrderedDict[str, Match] = OrderedDict()
        self._cache_state: tuple | None = None
        self.cache_hits = self.cache_lookups = 0
        self._name_counts: np.ndarray | None = None  # names per concept index, counted when first needed
        self.generator = None
        if ranker is not None:
            self.generator = CandidateGenerator(searcher, ranker.lexical_k, ngram_range=ranker.ngram_range)
            self.generator.counts = ranker.counts

    @property
    def needs_context(self) -> bool:
        """Whether `link` reads the mentions' contexts (only pair scorers do)."""
        return self.ranker is not None and bool(self.ranker.scorers)

    def build(self) -> None:
        if self.generator is not None:
            self.generator.build()

    def changed(self) -> None:
        """The searcher's names changed (synonyms added or removed)."""
        self._cache.clear()
        self._name_counts = None
        if self.generator is not None:
            self.generator.sync()

    def _state(self) -> tuple:
        """What a cached answer depends on besides the names (whose changes clear the cache)."""
        s, r = self.searcher, self.ranker
        ranker = (
            None
            if r is None
            else (r.is_fitted, r.reorder, r.fast_path, id(r.weights), id(r.counts), r.dense_k, r.lexical_k, r.model)
        )
        return (s.strategy, s.threshold, s.top_k, s.hidden, ranker)

    def candidate_sets(self, keys: Sequence[str]) -> list[CandidateSet]:
        """Candidate sets of distinct normalized queries (for training and inspection)."""
        vectors = self.searcher.query_vectors(keys)
        found = self.searcher.search_keys(keys, top_k=self.ranker.dense_k, vectors=vectors)
        return self.generator.generate(keys, [found[k] for k in keys], vectors)

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
        ranked = self.ranker is not None and self.ranker.is_fitted and self.ranker.reorder
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
