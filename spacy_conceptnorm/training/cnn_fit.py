"""Training Mondal et al.'s triplet CNN pair scorer (`linking.cnn_ranker.CNNRanker`).

Each step draws, per group, one right name as the positive and `negatives` wrong names of the same group as the
negatives, the mention being the anchor, and minimizes the triplet margin loss max(d(m, p) - d(m, n) + margin, 0).
With `mine`, half of the negatives are the wrong names closest to the mention under the current weights (hard
negative mining), the rest random. Adam (SparseAdam for fine-tuned embeddings); with dev groups, the epoch with the
best `rerank_accuracy` is kept. The settings are the scorer's own (they are saved in its config).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..linking.cnn_ranker import CNNRanker
from ..linking.pair_scorer import RankingGroup
from .pair_scorer_fit import FitReport, rerank_accuracy


def fit_cnn(
    scorer: CNNRanker,
    groups: Sequence[RankingGroup],
    dev: Sequence[RankingGroup] | None = None,
    *,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> FitReport:
    """Train a fresh network of `scorer` on triplets (mention, a right name, a wrong name) drawn from the groups;
    with `dev`, keep the epoch with the best `rerank_accuracy` on it."""
    start_time = time.perf_counter()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    usable = [g for g in groups if any(g.labels) and not all(g.labels)]
    scorer.initialize(seed)
    network = scorer.network
    dense = [p for p in network.parameters() if p is not network.embeddings.weight]
    optimizers = [torch.optim.Adam(dense, lr=scorer.lr)]
    if scorer.fine_tune:  # only the rows of the batch's tokens get a gradient and an update
        optimizers.append(torch.optim.SparseAdam([network.embeddings.weight], lr=scorer.lr))
    history: list[dict] = []
    best_accuracy, best_state = -1.0, None
    for epoch in range(1, scorer.epochs + 1):
        epoch_start = time.perf_counter()
        rng.shuffle(usable)
        network.train()
        total, steps = 0.0, 0
        for batch_start in range(0, len(usable), scorer.batch_size):
            loss = triplet_loss(scorer, usable[batch_start : batch_start + scorer.batch_size], rng)
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            total += loss.item()
            steps += 1
        network.eval()
        scorer.clear_cache()
        record = {"epoch": epoch, "loss": total / max(steps, 1)}
        if dev is not None:
            record["dev_accuracy"] = rerank_accuracy(scorer, dev)
            scorer.clear_cache()
            if record["dev_accuracy"] > best_accuracy:
                best_accuracy = record["dev_accuracy"]
                best_state = scorer.trainable_state()
        record["seconds"] = time.perf_counter() - epoch_start
        history.append(record)
        dev_text = f", dev rerank accuracy {record['dev_accuracy']:.4f}" if dev is not None else ""
        log(f"cnn epoch {epoch}/{scorer.epochs}: loss {record['loss']:.4f}{dev_text} ({record['seconds']:.1f}s)")
    if best_state is not None:
        network.load_state_dict(best_state, strict=False)
        scorer.clear_cache()
    return FitReport(seconds=time.perf_counter() - start_time, epochs=scorer.epochs, history=history)


def triplet_loss(scorer: CNNRanker, groups: Sequence[RankingGroup], rng: random.Random) -> torch.Tensor:
    """Mean triplet margin loss over the groups' triplets; each distinct text is embedded once."""
    closest = closest_first(scorer, groups) if scorer.mine else [list(range(len(g.names))) for g in groups]
    hard = scorer.negatives // 2 if scorer.mine else 0
    anchors, positives, negatives = [], [], []
    for g, order in zip(groups, closest):
        right = [n for n, label in zip(g.names, g.labels) if label]
        wrong = [g.names[i] for i in order if not g.labels[i]]
        positive = rng.choice(right)
        for negative in pick_negatives(wrong, scorer.negatives, hard, rng):
            anchors.append(g.mention)
            positives.append(positive)
            negatives.append(negative)
    texts = list(dict.fromkeys([*anchors, *positives, *negatives]))
    row = {t: i for i, t in enumerate(texts)}
    vectors = scorer.vectors(texts)

    def distance(a: list[str], b: list[str]) -> torch.Tensor:
        diff = vectors[[row[t] for t in a]] - vectors[[row[t] for t in b]]
        return (diff.pow(2).sum(dim=1) + 1e-12).sqrt()  # the epsilon keeps the gradient finite at distance 0

    return F.relu(distance(anchors, positives) - distance(anchors, negatives) + scorer.margin).mean()


def closest_first(scorer: CNNRanker, groups: Sequence[RankingGroup]) -> list[list[int]]:
    """Per group, its names' positions from the closest to the mention to the farthest, under the current weights
    (without gradients; the cache is cleared again since the weights are about to change)."""
    scores = scorer.score([g.mention for g in groups], [g.names for g in groups])
    scorer.clear_cache()
    scorer.network.train()
    return [np.argsort(-s, kind="stable").tolist() for s in scores]


def pick_negatives(wrong: Sequence[str], n: int, hard: int, rng: random.Random) -> list[str]:
    """`n` negatives from wrong names ordered closest first: the first `hard` of them, then random others."""
    rest = list(wrong[hard:])
    return list(wrong[:hard]) + rng.sample(rest, min(n - min(hard, len(wrong)), len(rest)))
