"""Training the second-stage ranker (`spacy_conceptnorm train-ranker`).

Ranking examples come from the annotated train mentions, linked by the saved pipeline itself: the train
documents are split into folds, and each fold's mentions are linked with their own (text, concept) pairs taken
out of the domain names (pairs that other folds also have stay), so a mention cannot find itself, as a test
mention that was never annotated cannot. Dev-only domain names are taken out throughout. Each example is a
mention's candidate set (sieve + lexical, with features) and its gold concept: the other candidates are its
hard negatives. Pair scorers (CNN, cross-encoder; the ranker's and its confidence scorer) are fitted first on the
same examples, then the ranker's logistic regression on the features and their scores. Dev Acc@1 is reported
before and after.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import binomtest
from spacy.language import Language
from spacy.tokens import Doc

from ..errors import ConceptNormError, Errors
from ..evaluation.gold import get_normalizer, gold_mentions, single_concept
from ..io.corpus import mention_spans
from ..linking.candidates import CandidateSet
from ..linking.pair_scorer import RankingGroup
from ..linking.scoring import concept_pairs
from ..pipeline.concept_normalizer import ConceptNormalizer, mention_context
from .ranker_fit import fit_pair_scorer, fit_ranker


@dataclass
class RankingExample:
    """A mention's candidate set and its gold concepts. mention (str): the text searched (the mention or its
    long form); context (str): the mention in its window of text."""

    candidates: CandidateSet
    gold: set[str]
    mention: str
    context: str

    def group(self, kb) -> RankingGroup:
        names = list(self.candidates.names)
        labels = [int(c in self.gold) for c in self.candidates.concept_ids]
        return RankingGroup(self.mention, names, labels, self.context)


def doc_pairs(normalizer: ConceptNormalizer, docs: list[Doc]) -> set[tuple[str, str]]:
    """(normalized text, concept id) pairs of the single-concept gold mentions of the docs."""
    return set(concept_pairs(normalizer.kb, ((e.text, e.kb_id_) for e in mention_spans(docs))))


def gold_queries(nlp: Language, docs: list[Doc]) -> list[tuple[str, str, set[str]]]:
    """(text searched, context, gold concept ids) for each single-concept gold mention that is searched as one
    part, with the text components run first (`gold_mentions`), so a defined abbreviation is searched as its long
    form too."""
    _, normalizer = get_normalizer(nlp)
    out = []
    for doc, mentions in gold_mentions(nlp, docs, link=False, single=True):
        doc_text = doc.text
        for m in mentions:
            parts = normalizer.queries(m.ent)
            if len(parts) != 1:
                continue
            context = mention_context(m.ent.text, doc_text, m.ent.start_char, m.ent.end_char)
            out.extend((text, context, {m.concept}) for text in parts[0])
    return out


def ranking_examples(
    nlp: Language, docs: list[Doc], folds: int = 5, seed: int = 0, log: Callable[[str], None] = print
) -> list[RankingExample]:
    """Ranking examples of the docs' gold mentions, each fold linked without its own domain names."""
    _, normalizer = get_normalizer(nlp)
    generator = normalizer.linker.candidate_generator()  # fits the lexical index unless it is there
    counts_before = generator.counts
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    split = [[docs[i] for i in order[f::folds]] for f in range(folds)]
    examples = []
    for f, fold_docs in enumerate(split):
        other_docs = [d for g, part in enumerate(split) if g != f for d in part]
        others = doc_pairs(normalizer, other_docs)
        if folds > 1:  # the prior counts the other folds' mentions only
            generator.counts = concept_counts(normalizer, other_docs)
        queries = gold_queries(nlp, fold_docs)
        with normalizer.synonyms_hidden(doc_pairs(normalizer, fold_docs) - others):
            keys = list(dict.fromkeys(k for t, _, _ in queries if (k := normalizer.kb.normalizer(t))))
            sets = dict(zip(keys, normalizer.linker.candidate_sets(keys)))
        for text, context, gold in queries:
            key = normalizer.kb.normalizer(text)
            if key in sets:
                examples.append(RankingExample(sets[key], gold, text, context))
        log(f"fold {f + 1}/{folds}: {len(queries)} queries, {len(keys)} distinct")
    generator.counts = counts_before
    return examples


def concept_counts(normalizer: ConceptNormalizer, docs: list[Doc]) -> dict[str, int]:
    """Concept id -> number of single-concept gold mentions of the docs."""
    counts: dict[str, int] = {}
    for ent in mention_spans(docs):
        if (cid := single_concept(normalizer.kb, ent.kb_id_)) is not None:
            counts[cid] = counts.get(cid, 0) + 1
    return counts


def recall_at(examples: list[RankingExample], k: int) -> float:
    """Share of examples whose gold concept is among the first k candidates (all candidates when k is 0)."""
    hits = [bool(e.gold & set(e.candidates.concept_ids[: k or None])) for e in examples]
    return sum(hits) / len(hits) if hits else 0.0


def top1_hits(normalizer: ConceptNormalizer, examples: list[RankingExample], reranked: bool) -> list[bool]:
    """Whether the sieve's answer (reranked=False) or the ranker's is right, per example."""
    if not reranked:
        return [bool(e.candidates.sieve.candidates) and e.candidates.sieve.candidates[0][0] in e.gold for e in examples]
    matches = normalizer.ranker.rerank(
        [e.candidates for e in examples], [e.mention for e in examples], [e.context for e in examples], 1
    )
    return [bool(m.candidates) and m.candidates[0][0] in e.gold for m, e in zip(matches, examples)]


def reorder_test(sieve_hits: list[bool], ranker_hits: list[bool], alpha: float = 0.05) -> dict:
    """Whether the ranker's order beats the sieve's on the same queries beyond chance: the exact one-sided sign
    test (McNemar's) on the queries where exactly one of them is right, at level `alpha`.

    On NCBI-disease dev (896 ranking queries) the ranker and the sieve differ on 25-29 queries and each is right
    alone about as often as the other (13 / 12, 12 / 13, 16 / 13 in three pipelines): the rule "more right answers
    on dev" switched the second stage on or off on one query, both ways in two runs of nearly the same code.

    sieve_hits, ranker_hits (List[bool]): Right or not, per query. alpha (float): The level (1.0: any net win).
    RETURNS (dict): {"wins": queries only the ranker gets right, "losses": only the sieve, "p_value", "reorder"}.
    """
    wins = sum(r and not s for s, r in zip(sieve_hits, ranker_hits))
    losses = sum(s and not r for s, r in zip(sieve_hits, ranker_hits))
    p_value = binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue if wins + losses else 1.0
    # a net win has p <= 1/2, so alpha 1.0 keeps any net win; a tie never reorders
    reorder = bool(wins > losses and p_value < alpha)
    return {"wins": wins, "losses": losses, "p_value": round(float(p_value), 6), "reorder": reorder}


def train_ranker(
    nlp: Language,
    train_docs: list[Doc],
    dev_docs: list[Doc],
    folds: int = 5,
    seed: int = 0,
    log: Callable[[str], None] = print,
    alpha: float = 0.05,
) -> dict:
    """Fit the pipeline's ranker (pair scorers first, then the logistic regression) on the train mentions, and
    report dev figures (dev mentions that are not train mentions are taken out of the domain names meanwhile).

    With dev docs, the ranker keeps reordering candidates only if it beats the sieve's order on the dev queries
    beyond chance (`reorder_test` at level `alpha`; `Ranker.reorder`); else the sieve's order stands for every
    mention. The lexical index the candidate sets need is fitted here when the pipeline has none; a pipeline saved
    afterwards keeps it only if the ranker reorders (`Linker.to_disk`).

    RETURNS (dict): Candidate recall, dev Acc@1 of the sieve and of the ranker, `reorder`, training times.
    """
    _, normalizer = get_normalizer(nlp)
    ranker = normalizer.ranker
    if ranker is None:
        raise ConceptNormError(Errors.E314)
    dev_only = doc_pairs(normalizer, dev_docs) - doc_pairs(normalizer, train_docs)
    report: dict = {"folds": folds, "seed": seed}
    ranker.counts = normalizer.linker.candidate_generator().counts = concept_counts(normalizer, train_docs)
    with normalizer.synonyms_hidden(dev_only):
        t = time.perf_counter()
        train = ranking_examples(nlp, train_docs, folds, seed, log)
        dev = ranking_examples(nlp, dev_docs, 1, seed, log) if dev_docs else []
        report["candidate_seconds"] = round(time.perf_counter() - t, 1)
        kb = normalizer.kb
        groups = [e.group(kb) for e in train]
        dev_groups = [e.group(kb) for e in dev] or None
        for name, scorer in ranker.pair_scorers.items():
            t = time.perf_counter()
            fit = fit_pair_scorer(scorer, groups, dev_groups, seed=seed, log=log)
            report[f"{name}_seconds"] = round(time.perf_counter() - t, 1)
            report[f"{name}_history"] = fit.history
        t = time.perf_counter()
        ranker.reorder = True
        report["fit"] = fit_ranker(
            ranker,
            [e.candidates for e in train],
            [e.gold for e in train],
            [e.mention for e in train],
            [e.context for e in train],
        )
        report["ranker_seconds"] = round(time.perf_counter() - t, 1)
        hits = {}
        for split, examples in (("train", train), ("dev", dev)):
            hits[split] = (top1_hits(normalizer, examples, False), top1_hits(normalizer, examples, True))
            report[split] = {
                "examples": len(examples),
                "recall@1": recall_at(examples, 1),
                f"recall@{ranker.dense_k}_dense": sum(
                    bool(e.gold & {c for c, _ in e.candidates.sieve.candidates}) for e in examples
                )
                / max(1, len(examples)),
                "recall_all": recall_at(examples, 0),
                "mean_candidates": sum(len(e.candidates.concept_ids) for e in examples) / max(1, len(examples)),
                "sieve_acc1": sum(hits[split][0]) / max(1, len(examples)),
                "ranker_acc1": sum(hits[split][1]) / max(1, len(examples)),
            }
            log(f"{split}: {report[split]}")
    if dev:  # chosen on dev: unless the ranker orders dev mentions better beyond chance, the sieve's order stands
        test = reorder_test(*hits["dev"], alpha)
        ranker.reorder = report["reorder"] = test.pop("reorder")
        report["dev"]["sign_test"] = {**test, "alpha": alpha}
        log(
            f"ranker reorders candidates: {ranker.reorder} (dev Acc@1 sieve {report['dev']['sieve_acc1']:.4f}, "
            f"ranker {report['dev']['ranker_acc1']:.4f}; right by the ranker alone {test['wins']}, by the sieve "
            f"alone {test['losses']}, one-sided sign test p = {test['p_value']:.3f} at alpha {alpha})"
        )
    return report


def save_examples(path: str | Path, kb, examples: list[RankingExample]) -> None:
    """RankingGroups of the examples as JSONL (for training pair scorers elsewhere)."""
    from ..linking.pair_scorer import write_groups

    write_groups(path, [e.group(kb) for e in examples])
