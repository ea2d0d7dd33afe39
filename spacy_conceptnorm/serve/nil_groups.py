"""Grouping the NIL mentions of a curation session into candidate new concepts.

"coder" (the default) clusters their distinct normalized texts with the CODER++ term clustering of
`spacy_conceptnorm.clustering` (`cluster_terms`: top-m neighbours by cosine under the pipeline's name encoder,
pairs at or above its default threshold, connected components); "text" groups identical normalized texts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..clustering import cluster_terms

NIL_METHODS = ("coder", "text")


class CachedEncoder:
    """Remembers the vectors it was asked for: the NIL set changes with every decision, its texts hardly do.

    encoder: Anything with `encode(texts) -> array` of unit rows (the pipeline's NameEncoder).
    """

    def __init__(self, encoder: object) -> None:
        self.encoder = encoder
        self.vectors: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, np.asarray(self.encoder.encode(new), dtype=np.float32)))
        return np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, 1), dtype=np.float32)


def group_nil(keys: Sequence[str], method: str, encoder: CachedEncoder) -> list[int]:
    """A group label per NIL mention.

    keys (Sequence[str]): The mentions' normalized texts.
    method (str): "coder" or "text" (see the module docstring).
    encoder (CachedEncoder): The pipeline's name encoder, for "coder".
    RETURNS (List[int]): The labels.
    """
    if method == "coder" and keys:
        distinct = sorted(set(keys))
        by_key = dict(zip(distinct, (int(x) for x in cluster_terms(distinct, encoder))))
        return [by_key[k] for k in keys]
    ids: dict[str, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]
