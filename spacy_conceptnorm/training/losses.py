"""Losses for training the name encoder, one idea per function, registered so configs can swap them.

A loss is called as `loss(embeddings, same)`: the (n, d) embeddings of a batch and the (n, n) bool matrix of
which texts share a concept (`Batch.same_concept()`). Mining works on that matrix rather than on one label per
text, so a name shared by several concepts is a positive of each; otherwise the miners do exactly what
pytorch-metric-learning's `BatchHardMiner` and `MultiSimilarityMiner` do with class labels (the tests check
this), and the losses, distances and reductions are pytorch-metric-learning's.

- `batch_hard_soft_margin.v1`: Xu & Bethard (2021) eqs. 3-6 (Hermans et al. 2017): Euclidean distances, for each
  anchor its farthest positive and nearest negative, loss ln(1 + exp(d_ap - d_an)) averaged over anchors.
  PML semantics checked: `TripletMarginLoss(margin=0, smooth_loss=True)` is softplus(d_ap - d_an + margin), so the
  margin must be 0 (its default is 0.05); `LpDistance` normalizes embeddings unless told not to, so
  `normalize` chooses between distances on unit vectors (monotone in the cosine the search uses) and on raw
  mean-pooled vectors (sentence-transformers' BatchHardSoftMarginTripletLoss, Xu & Bethard's code).
- `triplet_margin.v1`: DILBERT (Miftahutdinov et al. 2021) eq. 3, max(d(m, c_g) - d(m, c_n) + eps, 0) with
  eps = 1, every in-batch positive pair with `negatives` random in-batch negatives, Euclidean distance.
- `multi_similarity.v1`: CODER++ (Zeng et al. 2022) / CODER: multi-similarity loss on cosine similarities over
  the pairs its miner keeps (positives less similar than the most similar negative + eps, negatives more
  similar than the least similar positive - eps).
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.losses import MultiSimilarityLoss, TripletMarginLoss
from pytorch_metric_learning.reducers import MeanReducer
from spacy.util import registry


def pair_masks(same: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive pairs (same concept, not the same row) and negative pairs (no shared concept)."""
    eye = torch.eye(len(same), dtype=torch.bool, device=same.device)
    return same & ~eye, ~same


@torch.no_grad()
def batch_hard_triplets(dist: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(anchor, hardest positive, hardest negative) indices: per anchor with both, the farthest positive and the
    nearest negative under a distance matrix (Xu & Bethard eqs. 4-5)."""
    keep = pos.any(1) & neg.any(1)
    hardest_pos = dist.masked_fill(~pos, float("-inf")).argmax(1)
    hardest_neg = dist.masked_fill(~neg, float("inf")).argmin(1)
    anchors = keep.nonzero().squeeze(1)
    return anchors, hardest_pos[anchors], hardest_neg[anchors]


@torch.no_grad()
def random_triplets(
    pos: torch.Tensor, neg: torch.Tensor, per_pair: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, ...]:
    """Every positive pair (a, p), each with `per_pair` negatives of a drawn uniformly (with replacement)."""
    a, p = (pos & neg.any(1, keepdim=True)).nonzero(as_tuple=True)
    if not len(a):
        return a, p, p
    weights = neg[a].float()
    n = torch.multinomial(weights.cpu(), per_pair, replacement=True, generator=generator).to(a.device)
    return a.repeat_interleave(per_pair), p.repeat_interleave(per_pair), n.reshape(-1)


@torch.no_grad()
def multi_similarity_pairs(sim: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, epsilon: float):
    """(a1, p, a2, n) pairs kept by the multi-similarity miner: positives with S_ap < max_n S_an + eps and
    negatives with S_an > min_p S_ap - eps (CODER++'s P_i and N_i)."""
    hardest_neg = sim.masked_fill(~neg, float("-inf")).max(1, keepdim=True).values
    hardest_pos = sim.masked_fill(~pos, float("inf")).min(1, keepdim=True).values
    a1, p = (pos & (sim - epsilon < hardest_neg)).nonzero(as_tuple=True)
    a2, n = (neg & (sim + epsilon > hardest_pos)).nonzero(as_tuple=True)
    return a1, p, a2, n


def _zero(embeddings: torch.Tensor) -> torch.Tensor:
    return embeddings.sum() * 0.0


@registry.misc("spacy_conceptnorm.batch_hard_soft_margin.v1")
def batch_hard_soft_margin(normalize: bool = True):
    """Batch-hard triplet mining with the soft-margin loss (Xu & Bethard 2021, eqs. 3-6)."""
    distance = LpDistance(normalize_embeddings=normalize, p=2)
    triplet = TripletMarginLoss(margin=0.0, smooth_loss=True, distance=distance, reducer=MeanReducer())

    def loss(embeddings: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        triplets = batch_hard_triplets(distance(embeddings.detach()), *pair_masks(same))
        return triplet(embeddings, indices_tuple=triplets) if len(triplets[0]) else _zero(embeddings)

    return loss


@registry.misc("spacy_conceptnorm.triplet_margin.v1")
def triplet_margin(margin: float = 1.0, negatives: int = 5, normalize: bool = False):
    """The margin triplet loss with random in-batch negatives (DILBERT, eq. 3; margin/epsilon 1)."""
    triplet = TripletMarginLoss(
        margin=margin, distance=LpDistance(normalize_embeddings=normalize, p=2), reducer=MeanReducer()
    )

    def loss(embeddings: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        triplets = random_triplets(*pair_masks(same), negatives)  # torch's RNG: seeded, and restored on resume
        return triplet(embeddings, indices_tuple=triplets) if len(triplets[0]) else _zero(embeddings)

    return loss


@registry.misc("spacy_conceptnorm.multi_similarity.v1")
def multi_similarity(alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1):
    """The multi-similarity loss with its pair miner (CODER++ / CODER: alpha 2, beta 50, lambda 0.5, eps 0.1)."""
    similarity = CosineSimilarity()
    ms = MultiSimilarityLoss(alpha=alpha, beta=beta, base=base, distance=similarity)

    def loss(embeddings: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        pairs = multi_similarity_pairs(similarity(embeddings.detach()), *pair_masks(same), epsilon)
        return ms(embeddings, indices_tuple=pairs) if len(pairs[0]) or len(pairs[2]) else _zero(embeddings)

    return loss
