"""Training the cross-encoder pair scorer (`linking.cross_encoder.CrossEncoderRanker`).

The base model is fine-tuned afresh. Training is listwise: per group and step, the scores of one right name and
`negatives` wrong names of the same group go through a softmax, and the loss is the cross-entropy of the right one
(`loss = "binary"` instead takes a sigmoid cross-entropy per pair). A wrong name that reads like a right one (same
text, another concept) is never taken as a negative. AdamW, linear warm-up over the first 10% of the steps, then
linear decay; with dev groups, the epoch with the best `rerank_accuracy` is kept. The settings are the scorer's own
(they are saved in its config).
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..linking.cross_encoder import CrossEncoderRanker
from ..linking.pair_scorer import RankingGroup
from .pair_scorer_fit import FitReport, rerank_accuracy


def fit_cross_encoder(
    scorer: CrossEncoderRanker,
    groups: Sequence[RankingGroup],
    dev: Sequence[RankingGroup] | None = None,
    *,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> FitReport:
    """Fine-tune the base model of `scorer` afresh on the groups (each with a right and a wrong name); with `dev`,
    keep the epoch with the best `rerank_accuracy` on it."""
    start_time = time.perf_counter()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    usable = [g for g in groups if all(split_names(g))]
    scorer.initialize(seed)
    network = scorer.network
    network.get_input_embeddings().weight.requires_grad_(not scorer.freeze_embeddings)
    trained = [p for p in network.parameters() if p.requires_grad]
    per_epoch = min(len(usable), scorer.max_groups or len(usable))
    steps_per_epoch = math.ceil(per_epoch / scorer.batch_size)
    optimizer = torch.optim.AdamW(trained, lr=scorer.lr, weight_decay=0.01)
    schedule = warmup_then_decay(optimizer, max(steps_per_epoch * scorer.epochs, 1))
    history: list[dict] = []
    best_accuracy, best_state = -1.0, None
    for epoch in range(1, scorer.epochs + 1):
        epoch_start = last_log = time.perf_counter()
        network.train()
        total, pairs = 0.0, 0
        for step, batch in enumerate(epoch_steps(scorer, usable, per_epoch, rng)):
            loss, n_pairs = list_loss(scorer, batch, rng)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            total += loss.item()
            pairs += n_pairs
            if time.perf_counter() - last_log > 60 and step + 1 < steps_per_epoch:
                last_log = time.perf_counter()
                rate = pairs / (last_log - epoch_start)
                log(
                    f"cross_encoder epoch {epoch}: step {step + 1}/{steps_per_epoch}, loss {total / (step + 1):.4f}"
                    f" ({rate:.0f} pairs/s)"
                )
        network.eval()
        scorer.clear_cache()
        record = {"epoch": epoch, "loss": total / max(steps_per_epoch, 1), "pairs": pairs}
        record["train_seconds"] = time.perf_counter() - epoch_start
        if dev is not None:
            record["dev_accuracy"] = rerank_accuracy(scorer, dev)
            if record["dev_accuracy"] > best_accuracy:
                best_accuracy = record["dev_accuracy"]
                best_state = copy.deepcopy(network.state_dict())
        record["seconds"] = time.perf_counter() - epoch_start
        history.append(record)
        dev_text = f", dev rerank accuracy {record['dev_accuracy']:.4f}" if dev is not None else ""
        log(
            f"cross_encoder epoch {epoch}/{scorer.epochs}: loss {record['loss']:.4f}{dev_text} "
            f"({pairs} pairs, {record['seconds']:.1f}s)"
        )
    if best_state is not None:
        network.load_state_dict(best_state)
    scorer.clear_cache()
    return FitReport(seconds=time.perf_counter() - start_time, epochs=scorer.epochs, history=history)


def warmup_then_decay(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate rises linearly over the first 10% of the steps, then falls linearly towards 0."""
    warmup = max(total_steps // 10, 1)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(total_steps - step, 0) / (total_steps - warmup + 1))
    )


def epoch_steps(
    scorer: CrossEncoderRanker, groups: Sequence[RankingGroup], size: int, rng: random.Random
) -> list[list[RankingGroup]]:
    """One epoch's steps: `size` groups drawn at random, cut into steps of groups of similar text length (sorted
    within windows of 50 steps, then the steps shuffled), so that little of a step's batch is padding."""

    def length(group: RankingGroup) -> int:  # the group's longest pair in characters (a stand-in for tokens)
        return len(scorer.first_segment(group.mention, group.context)) + max(len(n) for n in group.names)

    order = rng.sample(list(groups), size)
    window = scorer.batch_size * 50
    steps = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=length)
        steps.extend(chunk[i : i + scorer.batch_size] for i in range(0, len(chunk), scorer.batch_size))
    rng.shuffle(steps)
    return steps


def list_loss(
    scorer: CrossEncoderRanker, groups: Sequence[RankingGroup], rng: random.Random
) -> tuple[torch.Tensor, int]:
    """The mean loss over the groups' lists (a right name first, then up to `negatives` wrong ones), and the number
    of pairs scored."""
    firsts, names, sizes = [], [], []
    top = min(scorer.top_negatives, scorer.negatives)
    for g in groups:
        right, wrong = split_names(g)
        rest = rng.sample(wrong[top:], min(scorer.negatives - top, len(wrong) - top))
        chosen = [rng.choice(right), *wrong[:top], *rest]
        first = scorer.first_segment(g.mention, g.context)
        firsts.extend([first] * len(chosen))
        names.extend(chosen)
        sizes.append(len(chosen))
    batch = scorer.tokenize(firsts, names, padding=True)
    logits = scorer.logits({key: torch.tensor(value) for key, value in batch.items()})
    if scorer.loss == "binary":
        targets = torch.cat([F.one_hot(torch.tensor(0), n).float() for n in sizes]).to(logits.device)
        return F.binary_cross_entropy_with_logits(logits, targets), len(names)
    lists = torch.full((len(sizes), max(sizes)), float("-inf"), device=logits.device)
    mask = torch.arange(max(sizes))[None, :] < torch.tensor(sizes)[:, None]
    lists = lists.masked_scatter(mask.to(logits.device), logits)
    targets = torch.zeros(len(sizes), dtype=torch.long, device=logits.device)
    return F.cross_entropy(lists, targets), len(names)


def split_names(group: RankingGroup) -> tuple[list[str], list[str]]:
    """A group's right names, and its distinct wrong names that differ from every right one (case ignored)."""
    right = [n for n, label in zip(group.names, group.labels) if label]
    taken = {n.lower() for n in right}
    wrong = []
    for n, label in zip(group.names, group.labels):
        if not label and n.lower() not in taken:
            taken.add(n.lower())
            wrong.append(n)
    return right, wrong
