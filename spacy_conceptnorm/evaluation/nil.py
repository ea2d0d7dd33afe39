"""NIL (out-of-KB) thresholds: DILBERT's three strategies (Miftahutdinov et al. 2021, "Out-of-KB prediction").

DILBERT orders mentions by the distance to their nearest concept; we use the link's calibrated confidence
(`ent._.kb_confidence`, the probability that the link is right; the top cosine before `calibrate` fits it)
instead (higher is closer), and a mention is NIL when it is under the threshold, as `concept_normalizer`'s
`nil_threshold` does. The strategies, from calibration mentions split into true positives (in-KB mentions
linked to a right concept) and out-of-KB mentions (DILBERT's false positives: mapped to a concept though they
have none):

- `first_fp`: the highest score of an out-of-KB mention (the first NIL in the list ordered by decreasing
  score): everything scoring under it is NIL. High precision of the links kept, low recall.
- `last_tp`: the lowest score of a true positive (the last TP in that list): every calibration TP is kept.
  High recall, low precision.
- `weighted`: the weighted average of the two, see `nil_thresholds`.

And the product's own operating point, the default of `calibrate`:
- `in_kb_budget`: the highest threshold that costs at most `IN_KB_BUDGET` of in-KB accuracy against NIL off
  (the right links it turns into NIL), so as many out-of-KB mentions as possible get NIL while the links users
  see stay right. DILBERT's thresholds sit on single extreme scores (the highest out-of-KB, the lowest right
  link), which on a probability either discard many right links or almost no out-of-KB mention.

As in the paper, a score equal to the threshold is linked (the paper's NIL needs a *larger* distance).

NCBI-disease has (almost) no NIL gold mentions, so out-of-KB cases are made by holding out concepts: random gold
concepts, whose mentions make up about a fifth of the mentions, are hidden from the search (`holding_out`), so
their mentions become out-of-KB. Gold ids the KB does not know are out-of-KB anyway.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from spacy.language import Language
from spacy.tokens import Doc

from ..errors import ConceptNormError, Errors
from ..io.corpus import mention_spans
from ..kb.knowledge_base import KnowledgeBase
from ..linking.scoring import gold_ids, is_correct
from ..search.sieve import SieveSearcher
from .gold import get_normalizer, link_gold_mentions

NIL_STRATEGIES = ("in_kb_budget", "first_fp", "last_tp", "weighted")
IN_KB_BUDGET = 0.005  # in-KB accuracy (a share of the in-KB mentions) `in_kb_budget` may give up: half a point
# Test hold-outs whose accuracies `nil_figures` also averages (seeds `seed` onwards): one hold-out is a noisy
# measure, as which concepts are held out moves the out-of-KB share at one threshold widely.
TEST_HOLD_OUTS = 8


@dataclass
class NilCase:
    """One calibration or test mention. score (float): the link's confidence; in_kb (bool): its concepts are searchable;
    correct (bool): the top candidate(s) are right (always False out of the KB)."""

    score: float
    in_kb: bool
    correct: bool


def nil_thresholds(
    tp_scores: Sequence[float],
    out_of_kb_scores: Sequence[float],
    in_kb: int | None = None,
    budget: float = IN_KB_BUDGET,
) -> dict[str, float]:
    """The three thresholds from the scores of true positives and of out-of-KB mentions.

    `weighted` is my reading of DILBERT's "weighted average of the first two threshold values. The proportion
    of TP cases used as a weight for the first strategy's threshold, the proportion of TP cases used as a
    weight for the second" (the repeated "TP" must be a slip, since the two weights of an average differ):
    with n_tp true positives and n_out out-of-KB mentions,
        weighted = n_tp / (n_tp + n_out) * first_fp + n_out / (n_tp + n_out) * last_tp.
    Wrongly linked in-KB mentions take no part in any of the three.

    tp_scores (Sequence[float]): Best scores of in-KB mentions whose top candidate is right.
    out_of_kb_scores (Sequence[float]): Best scores of out-of-KB mentions.
    in_kb (Optional[int]): The number of in-KB mentions (right or wrong); with it, `in_kb_budget` is added: the
        score of the right link that has floor(budget x in_kb) right links under it, which stay the only ones
        lost (a score equal to the threshold is linked).
    budget (float): The share of in-KB accuracy `in_kb_budget` may give up.
    RETURNS (Dict[str, float]): {"first_fp", "last_tp", "weighted"} and, with `in_kb`, "in_kb_budget".
    """
    if not tp_scores or not out_of_kb_scores:
        raise ConceptNormError(Errors.E906.format(tp=len(tp_scores), out=len(out_of_kb_scores)))
    first_fp, last_tp = max(out_of_kb_scores), min(tp_scores)
    w_first = len(tp_scores) / (len(tp_scores) + len(out_of_kb_scores))
    out = {"first_fp": first_fp, "last_tp": last_tp, "weighted": w_first * first_fp + (1 - w_first) * last_tp}
    if in_kb is not None:
        ranked = sorted(tp_scores)
        lost = min(int(budget * in_kb + 1e-9), len(ranked) - 1)
        while lost > 0 and ranked[lost] == ranked[lost - 1]:  # ties go together: losing fewer keeps the promise
            lost -= 1
        out = {"in_kb_budget": ranked[lost], **out}
    return out


def nil_accuracy(cases: Iterable[NilCase], threshold: float) -> dict[str, float]:
    """In-KB accuracy (right concept and not NIL), out-of-KB accuracy (NIL) and overall accuracy."""
    cases = list(cases)
    in_kb = [c.correct and c.score >= threshold for c in cases if c.in_kb]
    out = [c.score < threshold for c in cases if not c.in_kb]
    no_nil = [c.correct for c in cases if c.in_kb]
    return {
        "in_kb_acc": sum(in_kb) / len(in_kb) if in_kb else 0.0,
        "in_kb_acc_no_nil": sum(no_nil) / len(no_nil) if no_nil else 0.0,
        "out_of_kb_acc": sum(out) / len(out) if out else 0.0,
        "overall_acc": (sum(in_kb) + sum(out)) / len(cases) if cases else 0.0,
        "in_kb": len(in_kb),
        "out_of_kb": len(out),
    }


def held_out_concepts(kb: KnowledgeBase, docs: Iterable[Doc], fraction: float = 0.2, seed: int = 0) -> set[str]:
    """Random gold concepts (seeded) whose mentions make up about `fraction` of the docs' gold mentions.

    Concepts are drawn uniformly, not mentions: drawing 20% of the mentions would almost surely hit every
    frequent concept and hide most of the corpus. Concepts are added until their mentions
    reach the fraction, so the last one may overshoot it.
    """
    if not 0.0 < fraction < 1.0:
        raise ConceptNormError(Errors.E907.format(value=fraction))
    mentions = Counter(
        cid for ent in mention_spans(docs) for g in gold_ids(ent.kb_id_) if (cid := kb.resolve(g)) is not None
    )
    concepts = sorted(mentions)
    random.Random(seed).shuffle(concepts)
    held, covered, target = set(), 0, fraction * sum(mentions.values())
    for cid in concepts:
        if covered >= target:
            break
        held.add(cid)
        covered += mentions[cid]
    return held


@contextmanager
def holding_out(searcher: SieveSearcher, concepts: set[str]) -> Iterator[None]:
    """Search as if `concepts` were not in the KB (`SieveSearcher.hidden`): each sieve stage and the ranker's
    candidate generation drop them, so a stage that answered only thanks to a held-out concept passes the query
    on, as it would without the concept. Nothing is rebuilt or re-encoded."""
    before = searcher.hidden
    searcher.hidden = frozenset(concepts) | before
    try:
        yield
    finally:
        searcher.hidden = before


def nil_cases(nlp: Language, docs: list[Doc], held_out: set[str]) -> list[NilCase]:
    """Link the gold mentions with `held_out` hidden. A mention is out-of-KB when none of its gold ids is
    searchable, in-KB when all are; a composite with only some parts held out is left out."""
    normalizer = get_normalizer(nlp)[1]
    kb = normalizer.kb
    with holding_out(normalizer.searcher, held_out):
        mentions = link_gold_mentions(nlp, docs)
    cases = []
    for m in mentions:
        hidden = [(cid := kb.resolve(g)) is None or cid in held_out for g in gold_ids(m.gold)]
        if all(hidden) or not any(hidden):
            in_kb = not any(hidden)
            cases.append(NilCase(m.score, in_kb, in_kb and is_correct(kb, m.gold, m.parts, 1)))
    return cases


def nil_figures(
    nlp: Language,
    dev_docs: list[Doc],
    test_docs: list[Doc] | None = None,
    fraction: float = 0.2,
    seed: int = 0,
    hold_outs: int = TEST_HOLD_OUTS,
) -> dict:
    """Thresholds calibrated on dev (with held-out concepts) and each strategy's accuracies on dev and on test
    (with its own held-out concepts), as DILBERT reports them; on test also the mean over `hold_outs` hold-outs.

    nlp (Language): The pipeline (its configured sieve is used).
    dev_docs (List[Doc]): Calibration gold docs.
    test_docs (Optional[List[Doc]]): Test gold docs; None skips the test figures.
    fraction (float): Part of the gold mentions whose concepts are held out.
    seed (int): Seed of the random hold-out.
    hold_outs (int): Test hold-outs (seeds `seed`, `seed` + 1, ...) whose accuracies "test_mean" averages.
    RETURNS (dict): "thresholds" {strategy: value}, "dev"/"test"/"test_mean" {strategy: accuracies} ("test_mean":
        rates averaged over the hold-outs, mention counts summed), and the set-up.
    """
    kb = get_normalizer(nlp)[1].kb
    dev_held = held_out_concepts(kb, dev_docs, fraction, seed)
    dev_cases = nil_cases(nlp, dev_docs, dev_held)
    thresholds = nil_thresholds(
        [c.score for c in dev_cases if c.in_kb and c.correct],
        [c.score for c in dev_cases if not c.in_kb],
        in_kb=sum(c.in_kb for c in dev_cases),
    )
    out = {
        "holdout_fraction": fraction,
        "seed": seed,
        "thresholds": thresholds,
        "dev": {s: nil_accuracy(dev_cases, t) for s, t in thresholds.items()},
        "dev_held_out_concepts": len(dev_held),
    }
    if test_docs is not None:
        test_held = held_out_concepts(kb, test_docs, fraction, seed)
        test_cases = nil_cases(nlp, test_docs, test_held)
        out["test"] = {s: nil_accuracy(test_cases, t) for s, t in thresholds.items()}
        out["test_held_out_concepts"] = len(test_held)
        cases = [test_cases] + [
            nil_cases(nlp, test_docs, held_out_concepts(kb, test_docs, fraction, s))
            for s in range(seed + 1, seed + hold_outs)
        ]
        out["test_mean"] = {s: _mean_accuracy([nil_accuracy(c, t) for c in cases]) for s, t in thresholds.items()}
        out["test_hold_outs"] = len(cases)
    return out


def _mean_accuracy(accuracies: list[dict[str, float]]) -> dict[str, float]:
    """`nil_accuracy` results of several hold-outs: the rates averaged, the mention counts summed."""
    counts = ("in_kb", "out_of_kb")
    return {
        k: sum(a[k] for a in accuracies) if k in counts else sum(a[k] for a in accuracies) / len(accuracies)
        for k in accuracies[0]
    }
