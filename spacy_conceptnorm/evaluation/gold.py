"""Gold data for evaluation: reading gold docs, and linking their gold mentions with the pipeline.

Gold-mention linking follows `benchmarks.ncbi`: the gold entities lose their concept ids, the pipeline runs on
them with its `ner` disabled (the text components stay on), and each prediction is paired with its gold id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc

from ..errors import ConceptNormError, Errors
from ..io.corpus import gold_linking_off, read_docs, strip_links  # noqa: F401  (strip_links: re-exported)
from ..linking.scoring import NIL, accuracy_at
from ..pipeline.concept_normalizer import ConceptNormalizer

NO_SCORE = -1.0  # the lowest cosine: the score of a part that found no candidate


@dataclass
class LinkedMention:
    """A gold mention and what the pipeline predicted for it.

    gold (str): The gold concept id(s) as written, e.g. "D001943" or "D001943|D010051".
    text (str): The mention text.
    parts (List[List[str]]): Candidate concept ids per predicted part, best first.
    score (float): The confidence of the link (`kb_confidence`: the lowest part's for a composite); NIL is
        decided on it.
    kb_id (str): The predicted `kb_id_` as shipped (NIL decision and document consistency applied).
    """

    gold: str
    text: str
    parts: list[list[str]]
    score: float
    kb_id: str = ""


def read_gold_docs(nlp: Language, path: str | Path) -> list[Doc]:
    """Gold docs from a `.spacy` DocBin or a PubTator file (gold `ent.kb_id_` = concept id).

    nlp (Language): Provides the vocab and, for PubTator, the tokenizer.
    path (Path): The file.
    RETURNS (List[Doc]): The docs; a file without any gold mention raises ConceptNormError.
    """
    path = Path(path)
    if not path.is_file():
        raise ConceptNormError(Errors.E901.format(path=path))
    docs = list(read_docs(path, nlp))
    if not any(ent.kb_id_ for doc in docs for ent in doc.ents):
        raise ConceptNormError(Errors.E902.format(what=str(path)))
    return docs


def get_normalizer(nlp: Language, model: str = "the pipeline") -> tuple[str, ConceptNormalizer]:
    """The name and instance of the pipeline's concept_normalizer; ConceptNormError names `model` if none."""
    for name, pipe in nlp.pipeline:
        if isinstance(pipe, ConceptNormalizer):
            return name, pipe
    raise ConceptNormError(Errors.E903.format(model=model, names=nlp.pipe_names))


def link_gold_mentions(nlp: Language, docs: Iterable[Doc]) -> list[LinkedMention]:
    """Run the pipeline (without the components that set entities: `ner`, `dictionary_matcher`, `link_filter`)
    on the gold entities of the docs, one LinkedMention per gold mention that carries a concept id."""
    _, normalizer = get_normalizer(nlp)
    docs = list(docs)
    with nlp.select_pipes(disable=gold_linking_off(nlp)):
        predicted = list(nlp.pipe(strip_links(docs), batch_size=normalizer.cfg["batch_size"]))
    out = []
    for gold_doc, pred_doc in zip(docs, predicted):
        by_offsets = {(e.start_char, e.end_char): e for e in pred_doc.ents}
        for gold in gold_doc.ents:
            if gold.kb_id_:
                pred = by_offsets.get((gold.start_char, gold.end_char))
                parts, score = _parts_and_score(pred) if pred is not None else ([], NO_SCORE)
                out.append(LinkedMention(gold.kb_id_, gold.text, parts, score, pred.kb_id_ if pred else ""))
    return out


def _parts_and_score(span) -> tuple[list[list[str]], float]:
    records = span._.kb_parts or []
    parts = [[cid for cid, _ in r["candidates"]] for r in records]
    confidence = span._.kb_confidence
    return parts, NO_SCORE if confidence is None else float(confidence)


def mention_accuracy(nlp: Language, mentions: list[LinkedMention], refined_out: set[str]) -> dict[str, float]:
    """Acc@1 and Acc@5 of the ranking (NIL off) on all mentions and on the refined set (mentions whose normalized
    text is not in `refined_out`, the normalized domain/train mentions), and Acc@1 as shipped: read from
    `ent.kb_id_`, with the NIL decision and document consistency on."""
    kb = get_normalizer(nlp)[1].kb
    full = [(m.gold, m.parts) for m in mentions]
    refined = [(m.gold, m.parts) for m in mentions if kb.normalizer(m.text) not in refined_out]
    shipped = [(m.gold, shipped_parts(m.kb_id)) for m in mentions]
    shipped_refined = [(m.gold, shipped_parts(m.kb_id)) for m in mentions if kb.normalizer(m.text) not in refined_out]
    return {
        "acc1": accuracy_at(kb, full, 1),
        "acc5": accuracy_at(kb, full, 5),
        "refined_acc1": accuracy_at(kb, refined, 1),
        "refined_acc5": accuracy_at(kb, refined, 5),
        "shipped_acc1": accuracy_at(kb, shipped, 1),
        "shipped_refined_acc1": accuracy_at(kb, shipped_refined, 1),
        "mentions": len(full),
        "refined_mentions": len(refined),
    }


def shipped_parts(kb_id: str) -> list[list[str]]:
    """The predicted `kb_id_` as candidate parts: NIL parts predict nothing."""
    return [[cid] for cid in kb_id.split("|") if cid and cid != NIL]
