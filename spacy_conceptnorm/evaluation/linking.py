"""`evaluate_pipeline`: every figure of the evaluation report for one saved pipeline.

- gold-mention linking (the papers' setting): Acc@1/Acc@5 on the full and the refined test set, for the sieve as
  configured and optionally for each of the 14 search strategies; Acc@k ranks the candidates, so the pipeline's
  `nil_threshold` does not change it;
- end-to-end: NER and NER+linking precision/recall/F1 of the full pipeline on the raw texts (needs a `ner`);
- Acc@1 as shipped, read from `ent.kb_id_` (NIL decision and document consistency on);
- the confidence of each gold-mention link and whether its top candidate was right; the expected calibration
  error of `kb_confidence` and its reliability bins;
- NIL thresholds and accuracies (`nil.nil_figures`; on test also averaged over several hold-outs), when dev docs
  are given.
"""

from __future__ import annotations

from spacy.language import Language
from spacy.tokens import Doc

from ..errors import ConceptNormError, Errors
from ..io.corpus import mention_spans
from ..linking.confidence import expected_calibration_error, reliability
from ..linking.scoring import is_correct
from ..search.sieve import ALL_STRATEGIES
from .calibrate import dev_mentions_hidden
from .end_to_end import end_to_end_scores
from .gold import get_normalizer, link_gold_mentions, mention_accuracy, recognizers
from .nil import TEST_HOLD_OUTS, nil_figures


def evaluate_pipeline(
    nlp: Language,
    test_docs: list[Doc],
    domain_docs: list[Doc],
    dev_docs: list[Doc] | None = None,
    *,
    strategies: bool = False,
    holdout: float = 0.2,
    seed: int = 0,
    hold_outs: int = TEST_HOLD_OUTS,
) -> dict:
    """Evaluate a linking pipeline on gold docs.

    nlp (Language): A pipeline with a concept_normalizer (and a `ner` for the end-to-end scores).
    test_docs (List[Doc]): Gold test docs.
    domain_docs (List[Doc]): The train docs: test mentions whose normalized text is one of their mentions are
        left out of the refined set.
    dev_docs (Optional[List[Doc]]): Gold dev docs for the NIL calibration; None skips the NIL figures.
    strategies (bool): Also score the gold mentions with each of the 14 search strategies.
    holdout (float): Part of the gold mentions whose concepts are held out to make out-of-KB cases.
    seed (int): Seed of that hold-out.
    hold_outs (int): Test hold-outs (seeds `seed` onwards) the NIL accuracies are also averaged over.
    RETURNS (dict): "gold_mentions", "strategies", "end_to_end" (None without `ner`), "scores", "nil" (None
        without dev docs), and "pipeline" (strategy, nil_threshold).
    """
    _, normalizer = get_normalizer(nlp)
    if not any(True for _ in mention_spans(test_docs)):
        raise ConceptNormError(Errors.E902.format(what="test_docs"))
    kb = normalizer.kb
    refined_out = {kb.normalizer(ent.text) for ent in mention_spans(domain_docs)}
    mentions = link_gold_mentions(nlp, test_docs)
    result = {
        "pipeline": {"strategy": normalizer.cfg["strategy"], "nil_threshold": normalizer.cfg["nil_threshold"]},
        "gold_mentions": mention_accuracy(nlp, mentions, refined_out),
        "scores": {"right": [], "wrong": []},
        "strategies": {},
        "end_to_end": None,
        "nil": None,
    }
    right = [is_correct(kb, m.gold, m.parts, 1) for m in mentions]
    for m, ok in zip(mentions, right):
        result["scores"]["right" if ok else "wrong"].append(round(m.score, 4))
    probs = [max(0.0, m.score) for m in mentions]
    result["confidence"] = {"ece": expected_calibration_error(probs, right), "reliability": reliability(probs, right)}
    if strategies:
        configured = normalizer.cfg["strategy"]
        try:
            for strategy in ALL_STRATEGIES:
                normalizer.set_strategy(strategy)
                result["strategies"][strategy] = mention_accuracy(nlp, link_gold_mentions(nlp, test_docs), refined_out)
        finally:
            normalizer.set_strategy(configured)
    if recognizers(nlp):
        result["end_to_end"] = end_to_end_scores(nlp, test_docs, kb)
    if dev_docs is not None:  # calibrated as `calibrate` does: dev mentions are not domain names meanwhile
        with dev_mentions_hidden(nlp, dev_docs, domain_docs):
            result["nil"] = nil_figures(nlp, dev_docs, test_docs, holdout, seed, hold_outs)
    return result
