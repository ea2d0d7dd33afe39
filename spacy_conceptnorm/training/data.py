"""Training texts for the name encoder: Train:O and Train:OD (Xu & Bethard 2021, 3 and 4.2).

Every distinct normalized name is one *text*; every concept one *label*. A text carries the set of concepts it
denotes, so a string shared by several concepts (MEDIC has about a thousand) is a positive of each of them and a
negative of none. *Anchors* are (text, concept) pairs whose concept has at least one other text, so each anchor
can be given a positive. Train:O takes the ontology synonyms; Train:OD adds the annotated mentions, repeated so
that there is one mention anchor for every three ontology anchors (|D|/|O| = 1/3).

Texts are normalized with the knowledge base's normalizer, as the search encodes them.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConceptNormError, Errors
from ..io.corpus import mention_spans, read_docs
from ..kb.formats import read_ctd_tsv
from ..kb.knowledge_base import SOURCE_BITS, KnowledgeBase
from ..linking.scoring import NIL, concept_pairs

ONTOLOGY_BIT = SOURCE_BITS["ontology"]


@dataclass
class TrainingData:
    """Texts, their concepts, and the anchors of one epoch.

    texts (List[str]): Distinct normalized names; a text's id is its position.
    concept_ids (List[str]): Concept ids; a concept's label is its position.
    text_labels (List[FrozenSet[int]]): Per text, the labels of every concept it denotes.
    concept_texts (List[List[int]]): Per label, its texts.
    anchors (List[Tuple[int, int]]): (text, label) pairs trained as anchors in one epoch; mention anchors are
        repeated to reach the domain ratio.
    """

    kb: KnowledgeBase
    texts: list[str] = field(default_factory=list)
    concept_ids: list[str] = field(default_factory=list)
    text_labels: list[frozenset[int]] = field(default_factory=list)
    concept_texts: list[list[int]] = field(default_factory=list)
    anchors: list[tuple[int, int]] = field(default_factory=list)
    n_ontology_anchors: int = 0
    n_domain_pairs: int = 0

    def label(self, concept_id: str) -> int | None:
        return self._labels.get(concept_id)

    def __post_init__(self) -> None:
        self._labels = {cid: i for i, cid in enumerate(self.concept_ids)}

    def positives(self, text: int, label: int) -> list[int]:
        """The other texts of a concept."""
        return [t for t in self.concept_texts[label] if t != text]

    def summary(self) -> str:
        return (
            f"{len(self.texts)} texts, {len(self.concept_ids)} concepts, {len(self.anchors)} anchors "
            f"({self.n_ontology_anchors} ontology, {len(self.anchors) - self.n_ontology_anchors} from "
            f"{self.n_domain_pairs} mention pairs)"
        )


def gold_mentions(path: str | Path) -> list[tuple[str, str]]:
    """(mention text, gold id string) of every linked gold entity, composites included (for evaluation)."""
    return [(ent.text, ent.kb_id_) for ent in mention_spans(read_docs(path)) if ent.kb_id_ != NIL]


def mention_pairs(kb: KnowledgeBase, path: str | Path) -> list[tuple[str, str]]:
    """`concept_pairs` of the gold mentions in a file; ConceptNormError when there are none."""
    pairs = concept_pairs(kb, gold_mentions(path))
    if not pairs:
        raise ConceptNormError(Errors.E708.format(path=path))
    return list(pairs)


def build_training_data(
    kb: KnowledgeBase,
    train_on: str = "O",
    domain: str | Path | None = None,
    domain_ratio: float = 1 / 3,
    seed: int = 0,
) -> TrainingData:
    """The texts and anchors of Train:O (`train_on="O"`) or Train:OD (`"OD"`, mentions from `domain`)."""
    if train_on not in ("O", "OD"):
        raise ConceptNormError(Errors.E706.format(value=train_on))
    text_ids: dict[str, int] = {}
    links: list[tuple[int, str]] = []  # (text, concept id)
    for name in kb.names("ontology"):
        tid = text_ids.setdefault(name, len(text_ids))
        links.extend((tid, cid) for cid in kb.concepts_for(name, ONTOLOGY_BIT))
    n_ontology_links = len(links)
    domain_pairs: list[tuple[int, str]] = []
    if train_on == "OD":
        if domain is None:
            raise ConceptNormError(Errors.E701.format(detail="train_on = 'OD' needs [training] domain (mentions)"))
        for text, cid in mention_pairs(kb, domain):
            domain_pairs.append((text_ids.setdefault(text, len(text_ids)), cid))
        links.extend(domain_pairs)
    concept_ids = list(dict.fromkeys(cid for _, cid in links))
    data = TrainingData(kb, texts=list(text_ids), concept_ids=concept_ids)
    labels: list[set[int]] = [set() for _ in text_ids]
    concept_texts: dict[int, dict[int, None]] = defaultdict(dict)
    for tid, cid in links:
        label = data.label(cid)
        labels[tid].add(label)
        concept_texts[label][tid] = None
    data.text_labels = [frozenset(s) for s in labels]
    data.concept_texts = [list(concept_texts[i]) for i in range(len(concept_ids))]

    def usable(pairs: Iterable[tuple[int, str]]) -> list[tuple[int, int]]:
        out = [(tid, data.label(cid)) for tid, cid in pairs]
        return list(dict.fromkeys((t, lab) for t, lab in out if len(data.concept_texts[lab]) > 1))

    ontology_anchors = usable(links[:n_ontology_links])
    data.anchors = list(ontology_anchors)
    data.n_ontology_anchors = len(ontology_anchors)
    data.n_domain_pairs = len(domain_pairs)
    domain_anchors = usable(domain_pairs)
    if domain_anchors:
        data.anchors += repeat_to(domain_anchors, round(domain_ratio * len(ontology_anchors)), seed)
    if not data.anchors:
        raise ConceptNormError(Errors.E704.format(source="the " + ("ontology" if train_on == "O" else "training data")))
    return data


def repeat_to(items: list, total: int, seed: int = 0) -> list:
    """Whole copies of `items` then a random sample of them, `total` in all (at least one copy)."""
    if total <= len(items):
        return list(items)
    copies, rest = divmod(total, len(items))
    return items * copies + random.Random(seed).sample(items, rest)


def load_hierarchy(kb: KnowledgeBase, path: str | Path) -> dict[str, tuple[str, ...]]:
    """Parents of the KB's concepts from a CTD diseases TSV (its `MESH:`/`OMIM:` ids are mapped with
    `kb.resolve`, so MEDIC 2012's bare ids match); concepts or parents the KB lacks are dropped."""
    parents: dict[str, dict[str, None]] = defaultdict(dict)
    for concept, _ in read_ctd_tsv(path):
        cid = next((c for c in map(kb.resolve, concept.ids) if c is not None), None)
        if cid is None:
            continue
        for parent in concept.parents:
            pid = kb.resolve(parent)
            if pid is not None and pid != cid:
                parents[cid][pid] = None
    return {cid: tuple(ps) for cid, ps in parents.items()}


def children_of(parents: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    children: dict[str, list[str]] = defaultdict(list)
    for cid, ps in parents.items():
        for p in ps:
            children[p].append(cid)
    return {p: tuple(cs) for p, cs in children.items()}
