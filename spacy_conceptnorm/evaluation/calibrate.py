"""`calibrate`: tune a saved pipeline on dev gold data and write the result into it.

Four things are set on dev: the sieve `threshold` (Xu & Bethard's "Search:tuned": trained encoders give
higher cosines than the 0.95 the paper fixed, so the first stage answers wrongly more often), the one of
`SIEVE_THRESHOLDS` with the best dev Acc@1; the confidence model (`linking.confidence`: the probability that a
link is right, fitted on the dev links and on simulated out-of-KB links); then the NIL threshold on that
probability (see `nil`); then, for a pipeline with a `link_filter`, its `min_confidence` (see `recognition`).
While dev is scored, the dev mentions are taken out of the domain names (a pipeline assembled with train+dev
mentions as synonyms would otherwise find each dev mention itself), except those that are train mentions too;
they are put back before saving.

The values go to the component's cfg (saved in `concept_normalizer/cfg`, which `from_disk` reads) and to the
pipeline's config (`config.cfg`, `[components.concept_normalizer]`), so both agree after `spacy.load`. The
pipeline is written beside its target directory and swapped in, so a failure leaves the old one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc

from ..errors import ConceptNormError, Errors
from ..io.corpus import mention_spans
from ..io.pipelines import load, save
from ..kb.knowledge_base import DOMAIN, SOURCE_BITS
from ..linking.confidence import Confidence, expected_calibration_error, reliability
from ..linking.scoring import concept_pairs
from .gold import get_normalizer, gold_mentions, link_gold_mentions, mention_accuracy, read_gold_docs
from .nil import NIL_STRATEGIES, held_out_concepts, holding_out, nil_figures
from .recognition import tune_link_filter

DOMAIN_BIT = SOURCE_BITS[DOMAIN]
SIEVE_THRESHOLDS = (0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0)
# The confidence model also learns from simulated out-of-KB mentions (so that NIL can be told from a right link):
# their links weigh OUT_OF_KB_WEIGHT of the in-KB links' in all. More weight turns more out-of-KB mentions NIL and
# calibrates the in-KB links worse; 0.05, chosen on NCBI-disease dev (docs/benchmarks.md), buys most of the NIL
# detection for the least calibration error on in-KB links.
OUT_OF_KB_WEIGHT = 0.05
OUT_OF_KB_SEEDS = 4


def set_nil_threshold(nlp: Language, threshold: float) -> None:
    """Set the concept_normalizer's `nil_threshold` in its cfg and in `nlp.config`."""
    name, normalizer = get_normalizer(nlp)
    normalizer.cfg["nil_threshold"] = float(threshold)
    nlp.get_pipe_config(name)["nil_threshold"] = float(threshold)  # the object `nlp.config` is built from


def storable_threshold(value: float) -> float:
    """`value` rounded down to 6 decimals (a readable config), and at least 1e-9 under it: the mention whose score
    defined the threshold stays linked (a score equal to the threshold is linked) even if that score is
    recomputed a hair lower, e.g. in another batch."""
    stored = math.floor(value * 1e6) / 1e6
    return stored if stored <= value - 1e-9 else stored - 1e-6


def load_pipeline(model: str | Path) -> Language:
    """Load a pipeline directory (`io.pipelines.load`: every file checked); a missing one raises ConceptNormError
    naming it."""
    if not Path(model).is_dir():
        raise ConceptNormError(Errors.E904.format(path=model))
    nlp = load(model)
    get_normalizer(nlp, str(model))
    return nlp


def set_sieve_threshold(nlp: Language, threshold: float) -> None:
    """Set the concept_normalizer's sieve `threshold` in its searcher, its cfg and `nlp.config`."""
    name, normalizer = get_normalizer(nlp)
    normalizer.set_strategy(normalizer.cfg["strategy"], float(threshold))
    nlp.get_pipe_config(name)["threshold"] = float(threshold)


@contextmanager
def dev_mentions_hidden(nlp: Language, dev_docs: list[Doc], train_docs: list[Doc] | None) -> Iterator[int]:
    """Take the dev mentions out of the domain names for the duration (not those that are train mentions
    too), then put them back. Yields how many (name, concept) pairs were taken out."""
    _, normalizer = get_normalizer(nlp)
    kb = normalizer.kb

    def pairs(docs: list[Doc]) -> set[tuple[str, str]]:
        return set(concept_pairs(kb, ((ent.text, ent.kb_id_) for ent in mention_spans(docs))))

    keep = pairs(train_docs) if train_docs else set()
    hidden = sorted((name, cid) for name, cid in pairs(dev_docs) - keep if cid in kb.concepts_for(name, DOMAIN_BIT))
    normalizer.remove_synonyms(hidden)
    try:
        yield len(hidden)
    finally:
        normalizer.add_synonyms(hidden)


def link_evidence(nlp: Language, docs: list[Doc], concepts: set[str] | None = None) -> tuple[list[dict], list[bool]]:
    """The evidence of each single-concept gold mention's link and whether the link is right: what the confidence
    model is fitted on. The gold mentions go through the text components (`gold_mentions`), then are linked in one
    batch; a mention the concept_normalizer does not link (not one of its `labels`) or links as a composite is
    left out. `concepts`: keep only the mentions of these."""
    _, normalizer = get_normalizer(nlp)
    aligned = gold_mentions(nlp, docs, link=False, single=True)
    predictions = normalizer.predict([doc for doc, _ in aligned])
    evidence, correct = [], []
    for (doc, mentions), doc_pred in zip(aligned, predictions):
        linked = dict(zip(normalizer.entities_to_link(doc), doc_pred))
        for m in mentions:
            parts = linked.get(m.ent)
            if parts is None or len(parts) != 1 or (concepts is not None and m.concept not in concepts):
                continue
            match = parts[0][1]
            evidence.append(match.evidence)
            correct.append(bool(match.candidates) and match.candidates[0][0] == m.concept)
    return evidence, correct


def fit_confidence(nlp: Language, dev_docs: list[Doc], holdout: float = 0.2, seed: int = 0) -> dict:
    """Fit the linker's confidence model on the dev links, and on the links of simulated out-of-KB mentions
    (`OUT_OF_KB_SEEDS` hold-outs of `holdout` of the concepts, seeded after `seed`: not the hold-out the NIL
    threshold is then chosen on), which are all wrong, with `OUT_OF_KB_WEIGHT` in all; its ECE and reliability
    bins on the dev links."""
    _, normalizer = get_normalizer(nlp)
    evidence, correct = link_evidence(nlp, dev_docs)
    out_of_kb = []
    for s in range(seed + 1, seed + 1 + OUT_OF_KB_SEEDS):
        held = held_out_concepts(normalizer.kb, dev_docs, holdout, s)
        with holding_out(normalizer.searcher, held):
            out_of_kb += link_evidence(nlp, dev_docs, held)[0]
    weight = [1.0] * len(evidence) + [OUT_OF_KB_WEIGHT * len(evidence) / max(len(out_of_kb), 1)] * len(out_of_kb)
    confidence = Confidence().fit(evidence + out_of_kb, correct + [False] * len(out_of_kb), weight)
    normalizer.linker.confidence = confidence
    probs = confidence(evidence)
    return {
        "links": len(correct),
        "right": int(sum(correct)),
        "out_of_kb_links": len(out_of_kb),
        "ece": expected_calibration_error(probs, correct),
        "reliability": reliability(probs, correct),
        "model": confidence.to_dict(),
    }


def tune_sieve_threshold(nlp: Language, dev_docs: list[Doc], grid: tuple[float, ...] = SIEVE_THRESHOLDS) -> dict:
    """Dev Acc@1 of the configured sieve at each threshold of `grid`, and the best threshold (ties: the one
    nearest the paper's 0.95). A single-stage strategy has no threshold: the result is empty."""
    _, normalizer = get_normalizer(nlp)
    if len(normalizer.searcher.stages) < 2:
        return {}
    configured = normalizer.cfg["threshold"]
    scores = {}
    try:
        for threshold in grid:
            normalizer.set_strategy(normalizer.cfg["strategy"], threshold)
            scores[threshold] = mention_accuracy(nlp, link_gold_mentions(nlp, dev_docs), set())["acc1"]
    finally:
        normalizer.set_strategy(normalizer.cfg["strategy"], configured)
    best = max(grid, key=lambda t: (round(scores[t], 9), -abs(t - 0.95)))
    return {"dev_acc1": {str(t): acc for t, acc in scores.items()}, "threshold": best}


def calibrate(
    model: str | Path,
    dev: str | Path,
    strategy: str = "in_kb_budget",
    holdout: float = 0.2,
    seed: int = 0,
    *,
    train: str | Path | None = None,
    tune_sieve: bool = True,
    output_model: str | Path | None = None,
) -> dict:
    """Calibrate a saved pipeline on dev gold data: its sieve threshold, then its NIL threshold, and save it.

    model (Path): The saved pipeline directory.
    dev (Path): Dev gold data, a `.spacy` DocBin or a PubTator file.
    strategy (str): NIL threshold strategy: "in_kb_budget" (default), "weighted", "first_fp" or "last_tp".
    holdout (float): Part of the dev mentions whose concepts are held out to make out-of-KB cases.
    seed (int): Seed of the hold-out.
    train (Optional[Path]): Train gold data: dev mentions that are also train mentions stay domain names while
        dev is scored. None takes every dev mention out.
    tune_sieve (bool): Also choose the sieve threshold on dev (else keep the configured one).
    output_model (Optional[Path]): Where to save the calibrated pipeline; None rewrites `model` in place.
    RETURNS (dict): The NIL figures on dev, with "strategy", the chosen "nil_threshold", "sieve" (the sieve
        threshold search) and "hidden_dev_names".
    """
    if strategy not in NIL_STRATEGIES:
        raise ConceptNormError(Errors.E905.format(strategy=strategy, choices=NIL_STRATEGIES))
    nlp = load_pipeline(model)
    dev_docs = read_gold_docs(nlp, dev)
    train_docs = read_gold_docs(nlp, train) if train is not None else None
    with dev_mentions_hidden(nlp, dev_docs, train_docs) as hidden:
        sieve = tune_sieve_threshold(nlp, dev_docs) if tune_sieve else {}
        if sieve:
            set_sieve_threshold(nlp, sieve["threshold"])
        confidence = fit_confidence(nlp, dev_docs, holdout, seed)
        figures = nil_figures(nlp, dev_docs, None, holdout, seed)
    threshold = storable_threshold(figures["thresholds"][strategy])
    set_nil_threshold(nlp, threshold)
    with dev_mentions_hidden(nlp, dev_docs, train_docs):  # the NIL decision on: it counts end to end
        link_filter = tune_link_filter(nlp, dev_docs)
    save(nlp, output_model or model)
    return {
        **figures,
        "strategy": strategy,
        "nil_threshold": threshold,
        "sieve": sieve,
        "confidence": confidence,
        "link_filter": link_filter,
        "hidden_dev_names": hidden,
    }
