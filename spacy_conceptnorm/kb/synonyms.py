"""A knowledge base's synonym sets (the names of each concept; BNE's S_c) and a seeded held-out split of its
concepts: what BNE trains on and what its evaluation leaves out."""

from __future__ import annotations

import numpy as np

from .knowledge_base import ONTOLOGY, SOURCE_BITS, KnowledgeBase


def synonym_sets(kb: KnowledgeBase, exclude: frozenset[str] | set[str] = frozenset()) -> dict[str, list[str]]:
    """Concept id -> its normalized ontology names (the paper's S_c), concepts in `exclude` left out. A name of
    several concepts is in each of their sets."""
    sets: dict[str, list[str]] = {}
    for name in kb.names(ONTOLOGY):
        for cid in kb.concepts_for(name, SOURCE_BITS[ONTOLOGY]):
            if cid not in exclude:
                sets.setdefault(cid, []).append(name)
    return sets


def held_out_concepts(kb: KnowledgeBase, n: int, seed: int = 0, min_names: int = 2) -> list[str]:
    """`n` concepts with at least `min_names` names, drawn with a fixed seed (sorted ids, then a seeded choice):
    the paper's 1000 test concepts of section 4.1, left out of BNE's training."""
    eligible = sorted(cid for cid, names in synonym_sets(kb).items() if len(names) >= min_names)
    if n <= 0:
        return []
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(eligible), size=min(n, len(eligible)), replace=False)
    return sorted(eligible[i] for i in picked)
