"""Gold data for evaluation: reading gold docs, and running the pipeline over their gold mentions.

Every command that scores or learns from gold mentions (`evaluate`, `calibrate`, `train-ranker`) runs the pipeline
over them the same way, through `gold_mentions`: the gold entities lose their concept ids, the components that set
entities are off (so the gold entities stay as given) and so is `clinical_context`, the text components
(`abbreviation_resolver`, `composite_splitter`) stay on, and each gold mention is paired with the entity at its
offsets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc, Span

from ..errors import ConceptNormError, Errors
from ..io.corpus import read_docs
from ..kb.knowledge_base import KnowledgeBase
from ..linking.scoring import NIL, accuracy_at, gold_ids
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


def recognizers(nlp: Language) -> list[str]:
    """The components that set or change `doc.ents` (their factory assigns it): `ner`, `dictionary_matcher`,
    `link_filter`, an `entity_ruler`... Linking gold mentions turns them off, so the gold entities stay as given.

    nlp (Language): The pipeline.
    RETURNS (List[str]): Their names, in pipeline order.
    """
    return [name for name in nlp.pipe_names if "doc.ents" in nlp.get_pipe_meta(name).assigns]


def gold_linking_off(nlp: Language) -> list[str]:
    """The components that linking gold mentions turns off: the `recognizers`, so the gold entities stay as given,
    and `clinical_context`, which only reads the linked entities (and splits sentences at about 0.1 s an
    abstract).

    nlp (Language): The pipeline.
    RETURNS (List[str]): Their names, in pipeline order.
    """
    off = set(recognizers(nlp))
    return [name for name in nlp.pipe_names if name in off or nlp.get_pipe_meta(name).factory == "clinical_context"]


def strip_links(docs: Iterable[Doc]) -> list[Doc]:
    """Copies of the docs whose entities keep their offsets and labels but lose their gold ids: what the pipeline
    is given to link gold mentions.

    docs (Iterable[Doc]): Gold docs.
    RETURNS (List[Doc]): The copies, in order.
    """
    out = []
    for doc in docs:
        copy = Doc(doc.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])
        copy.ents = [copy.char_span(e.start_char, e.end_char, label=e.label_) for e in doc.ents]
        out.append(copy)
    return out


def single_concept(kb: KnowledgeBase, gold: str) -> str | None:
    """The concept of a gold id string that names exactly one concept the KB knows, as the KB's id; None for a
    composite ("D001|D002"), NIL, an empty id or an id the KB does not know.

    kb (KnowledgeBase): The knowledge base.
    gold (str): The gold concept id(s) as written.
    RETURNS (Optional[str]): The concept id, or None.
    """
    ids = gold_ids(gold) if gold and gold != NIL else []
    return kb.resolve(ids[0]) if len(ids) == 1 else None


@dataclass
class GoldMention:
    """A gold mention paired with the entity the pipeline has at its offsets.

    gold (Span): The gold entity; `gold.kb_id_` holds its concept id(s) as written.
    ent (Optional[Span]): The entity at the same character offsets in the processed doc (linked when the
        concept_normalizer ran); None where there is none.
    concept (Optional[str]): The gold concept as the KB's id where the mention has exactly one id that the KB
        knows (`single_concept`); None for a composite, NIL or an unknown id.
    """

    gold: Span
    ent: Span | None
    concept: str | None


def gold_mentions(
    nlp: Language, docs: Iterable[Doc], *, link: bool = True, single: bool = False
) -> list[tuple[Doc, list[GoldMention]]]:
    """Run the pipeline over the gold entities of the docs and pair each gold mention that carries a concept id
    with the entity at its character offsets: the one recipe of `evaluate`, `calibrate` and `train-ranker`.

    The gold entities, without their ids (`strip_links`), go through every component but those of
    `gold_linking_off` (the recognizers and `clinical_context`), in batches of the concept_normalizer's
    `batch_size`; the text components (`abbreviation_resolver`, `composite_splitter`) so set what the
    concept_normalizer reads.

    nlp (Language): The pipeline, with a concept_normalizer.
    docs (Iterable[Doc]): Gold docs (`ent.kb_id_` = concept id(s)).
    link (bool): Run the concept_normalizer too; False stops at the text components (for a caller that searches
        or predicts itself).
    single (bool): Keep only the mentions of exactly one concept that the KB knows and that the pipeline has an
        entity for (`GoldMention.concept` and `GoldMention.ent` set); else every gold mention with an id.
    RETURNS (List[Tuple[Doc, List[GoldMention]]]): Per doc, in order: the processed doc and its gold mentions,
        in document order.
    """
    name, normalizer = get_normalizer(nlp)
    docs = list(docs)
    off = gold_linking_off(nlp) + ([] if link else [name])
    with nlp.select_pipes(disable=off):
        processed = list(nlp.pipe(strip_links(docs), batch_size=normalizer.cfg["batch_size"]))
    out = []
    for gold_doc, doc in zip(docs, processed):
        by_offsets = {(e.start_char, e.end_char): e for e in doc.ents}
        mentions = []
        for gold in gold_doc.ents:
            if not gold.kb_id_:
                continue
            ent = by_offsets.get((gold.start_char, gold.end_char))
            concept = single_concept(normalizer.kb, gold.kb_id_)
            if not single or (ent is not None and concept is not None):
                mentions.append(GoldMention(gold, ent, concept))
        out.append((doc, mentions))
    return out


def link_gold_mentions(nlp: Language, docs: Iterable[Doc]) -> list[LinkedMention]:
    """Link the gold mentions of the docs with the pipeline (`gold_mentions`): one LinkedMention per gold mention
    that carries a concept id, composites included.

    nlp (Language): The pipeline, with a concept_normalizer.
    docs (Iterable[Doc]): Gold docs.
    RETURNS (List[LinkedMention]): The mentions, in document order.
    """
    out = []
    for _, mentions in gold_mentions(nlp, docs):
        for m in mentions:
            if m.ent is None:  # the pipeline lost the mention: nothing predicted
                out.append(LinkedMention(m.gold.kb_id_, m.gold.text, [], NO_SCORE))
            else:
                out.append(LinkedMention(m.gold.kb_id_, m.gold.text, *_parts_and_score(m.ent), m.ent.kb_id_))
    return out


def _parts_and_score(span: Span) -> tuple[list[list[str]], float]:
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
