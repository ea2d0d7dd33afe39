"""End-to-end scores: the full pipeline (ner included) on the raw test texts.

NER: a predicted entity is right when its span (character offsets) and label equal a gold entity's.
NER+linking: it must also carry a right concept id (`ent.kb_id_`, so a NIL prediction is wrong), under the
usual match rule: any id of the concept counts, a composite is right only when every gold id is predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from spacy.language import Language
from spacy.scorer import PRFScore
from spacy.tokens import Doc, Span

from ..kb.knowledge_base import KnowledgeBase
from ..linking.scoring import NIL, is_correct
from .boundaries import boundary_errors


def prf(right: int, predicted: int, gold: int) -> dict[str, float]:
    """Precision, recall and F1 from counts (0.0 where undefined), by spaCy's `PRFScore`."""
    return PRFScore(tp=right, fp=predicted - right, fn=gold - right).to_dict()


def end_to_end_scores(nlp: Language, docs: list[Doc], kb: KnowledgeBase) -> dict[str, dict[str, float]]:
    """NER and NER+linking precision/recall/F1 of the pipeline run on the texts of the gold docs.

    nlp (Language): The full pipeline, with a `ner` that sets the entities.
    docs (List[Doc]): Gold docs (gold `ent.kb_id_` = concept id).
    kb (KnowledgeBase): Resolves alternative ids.
    RETURNS (Dict[str, Dict[str, float]]): {"ner": {"p", "r", "f"}, "ner_linking": {...}, "counts": {...},
        "boundaries": the boundary-error categories (`boundaries.boundary_errors`)}.
    """
    predicted = list(nlp.pipe(doc.text for doc in docs))
    return {**score_docs(docs, predicted, kb), "boundaries": boundary_errors(zip(docs, predicted))}


def score_docs(
    docs: list[Doc], predicted: Iterable[Doc], kb: KnowledgeBase, keep: Callable[[Span], bool] | None = None
) -> dict[str, dict[str, float]]:
    """`end_to_end_scores` of docs already predicted (in the order of the gold docs).

    docs (List[Doc]): Gold docs. predicted (Iterable[Doc]): The pipeline's docs of their texts.
    kb (KnowledgeBase): Resolves alternative ids.
    keep (Optional[Callable[[Span], bool]]): Score only the predicted entities it keeps (None: all).
    """
    n_pred = n_gold = ner_right = link_right = 0
    for gold_doc, pred_doc in zip(docs, predicted):
        gold = {(e.start_char, e.end_char, e.label_): e.kb_id_ for e in gold_doc.ents}
        n_gold += len(gold)
        ents = [ent for ent in pred_doc.ents if keep is None or keep(ent)]
        n_pred += len(ents)
        for ent in ents:
            gold_id = gold.get((ent.start_char, ent.end_char, ent.label_))
            if gold_id is None:
                continue
            ner_right += 1
            parts = [[cid] for cid in ent.kb_id_.split("|") if cid and cid != NIL]
            link_right += bool(gold_id) and is_correct(kb, gold_id, parts, 1)
    return {
        "ner": prf(ner_right, n_pred, n_gold),
        "ner_linking": prf(link_right, n_pred, n_gold),
        "counts": {"predicted": n_pred, "gold": n_gold, "ner_right": ner_right, "ner_linking_right": link_right},
    }
