"""Batch construction for triplet training: which names share a batch.

Batch-hard mining (Xu & Bethard 2021, 3.1) finds its triplets inside a batch, so every anchor must bring a
positive: each anchor is added with positive(s) of its concept ("we randomly sample one positive text for each
anchor text and group them into batches", 4.2). The strategies differ in what else joins the anchor's group:

- `random` (DILBERT's random sampling; Xu & Bethard with positives = 1): `positives` random texts of the concept.
  The other groups of the batch are random, so the in-batch negatives are random names.
- `random+parents` (DILBERT): plus `related` names of the concept's parents (CTD hierarchy), trained as extra
  positives of the anchor.
- `resampling` (DILBERT, after Gillick et al. 2019): with the current model, the `search_k` nearest names of
  each anchor; those ranked above the first correct one are hard negatives (up to `negatives`), and the closest
  correct one is the positive.
- `resampling+siblings` (DILBERT): plus `related` names of sibling concepts (children of the concept's parents)
  as negatives.
- `dynamic` (CODER++, Zeng et al. 2022, 4.2): `positives` random texts of the concept and the `neighbours`
  nearest names of the anchor, whatever their concept, from a FAISS index of every training text re-encoded
  with the current model at the start of every epoch.

Positives and negatives are never fixed by the sampler: a batch carries each text's concept labels and the loss
compares them, so a string shared by several concepts is a positive of each.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from spacy.util import registry

from ..errors import ConceptNormError, Errors
from ..search.index import VectorIndex
from .data import TrainingData, children_of, load_hierarchy

STRATEGIES = ("random", "random+parents", "resampling", "resampling+siblings", "dynamic")


@dataclass
class Batch:
    """Text ids, the concept labels each carries in this batch, and the positions of the anchors."""

    texts: list[int]
    labels: list[frozenset[int]]
    anchors: list[int]

    def __len__(self) -> int:
        return len(self.texts)

    def same_concept(self, device: str | torch.device = "cpu") -> torch.Tensor:
        """(n, n) bool: whether texts i and j share a concept label (the diagonal is True)."""
        slots: dict[int, int] = {}
        rows, cols = [], []
        for i, labels in enumerate(self.labels):
            for label in labels:
                rows.append(i)
                cols.append(slots.setdefault(label, len(slots)))
        onehot = torch.zeros(len(self.texts), len(slots), device=device)
        onehot[rows, cols] = 1.0
        return (onehot @ onehot.T) > 0

    def reordered(self, order: list[int]) -> Batch:
        where = {old: new for new, old in enumerate(order)}
        return Batch([self.texts[i] for i in order], [self.labels[i] for i in order], [where[a] for a in self.anchors])


class Group(NamedTuple):
    """What joins an anchor in its batch: positives of its concept, names trained as its negatives, and names of
    other concepts trained as extra positives (given the anchor's label in this batch)."""

    positives: list[int]
    negatives: list[int] = []
    extra: list[int] = []

    def texts(self) -> list[int]:
        return [*self.positives, *self.negatives, *self.extra]


class BatchBuilder:
    """Fills batches group by group; a text already in the batch is not added twice (its labels are merged)."""

    def __init__(self, data: TrainingData, size: int) -> None:
        self.data, self.size = data, size
        self._reset()

    def _reset(self) -> None:
        self.positions: dict[int, int] = {}
        self.labels: list[set[int]] = []
        self.anchors: list[int] = []

    def room(self, texts: list[int]) -> bool:
        return len(self.positions) + sum(t not in self.positions for t in dict.fromkeys(texts)) <= self.size

    def _add(self, text: int, extra: int | None = None) -> int:
        pos = self.positions.get(text)
        if pos is None:
            pos = self.positions[text] = len(self.labels)
            self.labels.append(set(self.data.text_labels[text]))
        if extra is not None:
            self.labels[pos].add(extra)
        return pos

    def add_group(self, anchor: int, label: int, group: Group) -> None:
        """An anchor and its group; the group's `extra` names are given the anchor's label."""
        self.anchors.append(self._add(anchor))
        for t in group.positives:
            self._add(t)
        for t in group.extra:
            self._add(t, label)
        for t in group.negatives:
            self._add(t)

    def take(self) -> Batch | None:
        if not self.labels:
            return None
        batch = Batch(list(self.positions), [frozenset(s) for s in self.labels], list(dict.fromkeys(self.anchors)))
        self._reset()
        return batch


class TripletSampler:
    """Batches for one epoch under one strategy (see the module docstring).

    strategy (str): One of `STRATEGIES`.
    positives (int): Positives per anchor (Xu & Bethard: 1; CODER++: k).
    related (int): Parent names (`random+parents`) or sibling names (`resampling+siblings`) per anchor.
    negatives (int): Most hard negatives per anchor (`resampling*`).
    neighbours (int): Nearest names per anchor (`dynamic`, CODER++'s m).
    search_k (int): Names retrieved per anchor to find hard negatives (`resampling*`).
    hierarchy (Optional[str]): CTD diseases TSV with ParentIDs, for parents and siblings.
    anchors_per_epoch (int): Anchors drawn for each epoch (a different random subset each time); 0 takes them
        all. Shorter epochs re-mine more often (`resampling*`, `dynamic`) and evaluate more often.
    """

    def __init__(
        self,
        strategy: str = "random",
        positives: int = 1,
        related: int = 2,
        negatives: int = 5,
        neighbours: int = 4,
        search_k: int = 32,
        hierarchy: str | None = None,
        anchors_per_epoch: int = 0,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConceptNormError(Errors.E702.format(strategy=strategy, choices=list(STRATEGIES)))
        if strategy in ("random+parents", "resampling+siblings") and not hierarchy:
            raise ConceptNormError(Errors.E703.format(strategy=strategy))
        for key, value in (("positives", positives), ("related", related), ("negatives", negatives),
                           ("neighbours", neighbours), ("search_k", search_k),
                           ("anchors_per_epoch", anchors_per_epoch)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "positives" else 0):
                raise ConceptNormError(Errors.E701.format(detail=f"[training.sampler] {key} = {value!r}"))
        self.strategy = strategy
        self.positives, self.related, self.negatives = positives, related, negatives
        self.neighbours, self.search_k = neighbours, search_k
        self.hierarchy = hierarchy
        self.anchors_per_epoch = anchors_per_epoch
        self.data: TrainingData | None = None
        self.parents: dict[int, list[int]] = {}
        self.siblings: dict[int, list[int]] = {}

    @property
    def needs_model(self) -> bool:
        return self.strategy in ("resampling", "resampling+siblings", "dynamic")

    def group_size(self) -> int:
        """The most names one anchor's group adds to a batch."""
        size = 1 + self.positives
        if self.strategy == "random+parents":
            size += self.related
        elif self.strategy.startswith("resampling"):
            size = 2 + self.negatives + (self.related if self.strategy == "resampling+siblings" else 0)
        elif self.strategy == "dynamic":
            size += self.neighbours
        return size

    def setup(self, data: TrainingData) -> None:
        """Bind the training data; map the hierarchy onto its labels when the strategy uses one."""
        self.data = data
        if self.strategy in ("random+parents", "resampling+siblings"):
            parents = load_hierarchy(data.kb, self.hierarchy)
            as_labels = {
                data.label(c): [data.label(p) for p in ps if data.label(p) is not None]
                for c, ps in parents.items()
                if data.label(c) is not None
            }
            self.parents = {c: ps for c, ps in as_labels.items() if ps}
            children = children_of({c: tuple(ps) for c, ps in self.parents.items()})
            self.siblings = {
                c: list(dict.fromkeys(s for p in ps for s in children.get(p, ()) if s != c))
                for c, ps in self.parents.items()
            }

    def estimate_batches(self, batch_size: int) -> int:
        """About how many batches one epoch gives (for progress bars and the learning-rate schedule)."""
        per_anchor = self.group_size() if self.strategy != "random" else 1 + self.positives
        per_batch = max(1, batch_size // per_anchor)
        return -(-self.epoch_anchors() // per_batch)

    def epoch_anchors(self) -> int:
        n = len(self.data.anchors)
        return min(n, self.anchors_per_epoch) if self.anchors_per_epoch else n

    def batches(self, epoch: int, seed: int, batch_size: int, encoder=None) -> Iterator[Batch]:
        """The batches of one epoch, the same for the same (seed, epoch) and model."""
        if batch_size < self.group_size():
            raise ConceptNormError(
                Errors.E709.format(batch_size=batch_size, strategy=self.strategy, needed=self.group_size())
            )
        rng = random.Random(seed * 1_000_003 + epoch)
        anchors = list(self.data.anchors)
        rng.shuffle(anchors)
        anchors = anchors[: self.epoch_anchors()]
        neighbours = self.nearest(encoder, sorted({t for t, _ in anchors})) if self.needs_model else None
        builder = BatchBuilder(self.data, batch_size)
        for text, label in anchors:
            group = self.group(text, label, rng, neighbours)
            if not builder.room([text, *group.texts()]):
                batch = builder.take()
                if batch is not None:
                    yield batch
            builder.add_group(text, label, group)
        batch = builder.take()
        if batch is not None:
            yield batch

    def group(self, text: int, label: int, rng: random.Random, neighbours: np.ndarray | None) -> Group:
        """The group of one anchor under this strategy."""
        data = self.data
        pool = data.positives(text, label)
        if self.strategy.startswith("resampling"):
            positive, hard = self._ranked(text, label, neighbours[text])
            positives = [positive if positive is not None else rng.choice(pool)]
            negatives = hard[: self.negatives]
            if self.strategy == "resampling+siblings":
                negatives += self._names_of(self.siblings.get(label, ()), self.related, rng, text)
            return Group(positives, negatives)
        positives = rng.sample(pool, min(self.positives, len(pool)))
        if self.strategy == "random+parents":
            return Group(positives, extra=self._names_of(self.parents.get(label, ()), self.related, rng, text))
        if self.strategy == "dynamic":
            return Group(positives, [int(t) for t in neighbours[text] if t >= 0 and t != text][: self.neighbours])
        return Group(positives)

    def _ranked(self, text: int, label: int, ranked: np.ndarray) -> tuple[int | None, list[int]]:
        """The closest correct name and the names ranked above it (the anchor itself skipped)."""
        above = []
        for t in ranked:
            t = int(t)
            if t < 0 or t == text:
                continue
            if label in self.data.text_labels[t]:
                return t, above
            above.append(t)
        return None, above

    def _names_of(self, labels, k: int, rng: random.Random, exclude: int) -> list[int]:
        names = list(dict.fromkeys(t for lab in labels for t in self.data.concept_texts[lab] if t != exclude))
        return rng.sample(names, min(k, len(names)))

    def nearest(self, encoder, queries: list[int] | None = None) -> np.ndarray:
        """(texts, k) ids of the nearest texts of each query text (default: every anchor) under the current
        model, nearest first (the text itself included); rows of other texts are -1."""
        k = self.neighbours + 1 if self.strategy == "dynamic" else self.search_k + 1
        vectors = encoder.encode(self.data.texts, progress=True)
        index = VectorIndex(vectors.shape[1])
        index.add(np.arange(len(vectors), dtype=np.int64), vectors)
        queries = sorted({t for t, _ in self.data.anchors}) if queries is None else queries
        out = np.full((len(self.data.texts), k), -1, dtype=np.int64)
        out[queries] = index.search(vectors[queries], k)[1]  # the exact index bounds its own score matrix
        return out


# Registered so a config can pick it: `@misc = "spacy_conceptnorm.triplet_sampler.v1"`.
registry.misc("spacy_conceptnorm.triplet_sampler.v1")(TripletSampler)
