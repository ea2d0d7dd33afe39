"""The concept_normalizer reading the abbreviation_resolver's long forms and the composite_splitter's parts."""

import pytest
import spacy

from .test_component import doc_with_ents


@pytest.fixture(scope="module")
def pipelines(linker_nlp):
    full = spacy.blank("en")
    full.add_pipe("abbreviation_resolver")
    full.add_pipe("composite_splitter")
    full.add_pipe("concept_normalizer", source=linker_nlp)
    return full


TEXT = "Cancer of the ovary (COV) was studied in 40 women. Women with COV and their relatives were genotyped."


def test_short_forms_are_linked_through_their_long_form(pipelines):
    doc = doc_with_ents(pipelines, TEXT, [("Cancer of the ovary", "Disease")])
    start = TEXT.rindex("COV")
    doc.ents = [*doc.ents, doc.char_span(start, start + 3, label="Disease")]
    linked = pipelines(doc).ents
    assert linked[1].text == "COV" and linked[1]._.long_form == "Cancer of the ovary"
    assert linked[1].kb_id_ == linked[0].kb_id_ == "D010051"
    assert linked[1]._.kb_parts[0]["text"] == "Cancer of the ovary"  # the long form scored better


def test_mention_mode_ignores_long_forms(pipelines):
    normalizer = pipelines.get_pipe("concept_normalizer")
    doc = doc_with_ents(pipelines, TEXT, [("Cancer of the ovary", "Disease")])
    start = TEXT.rindex("COV")
    doc.ents = [*doc.ents, doc.char_span(start, start + 3, label="Disease")]
    try:  # the pipeline is shared by the module
        normalizer.cfg["long_form"] = "mention"
        ent = pipelines(doc).ents[1]
    finally:
        normalizer.cfg["long_form"] = "best"
    assert ent._.long_form == "Cancer of the ovary"  # the resolver still ran
    assert ent._.kb_parts[0]["text"] == "COV" and ent.kb_id_ != "D010051"


def test_composite_mentions_link_each_part_in_order(pipelines):
    text = "Germline BRCA1 mutations predispose to breast and ovarian cancer."
    ent = pipelines(doc_with_ents(pipelines, text, [("breast and ovarian cancer", "Disease")])).ents[0]
    assert list(ent._.composite_parts) == ["breast cancer", "ovarian cancer"]
    assert ent.kb_id_ == "D001943|D010051"
    # kb_ents keeps scispacy's shape, the parts' candidates merged; each part's own list is in kb_parts
    assert all(isinstance(cid, str) and isinstance(score, float) for cid, score in ent._.kb_ents)
    assert {"D001943", "D010051"} <= {cid for cid, _ in ent._.kb_ents}
    scores = [score for _, score in ent._.kb_ents]
    assert scores == sorted(scores, reverse=True)
    assert [p["candidates"][0][0] for p in ent._.kb_parts] == ["D001943", "D010051"]
    assert ent._.kb_stage.count("|") == 1 and [p["text"] for p in ent._.kb_parts] == list(ent._.composite_parts)


def test_plain_mentions_are_unchanged_by_the_text_components(pipelines, linker_nlp):
    text = "Risk of breast cancer in carriers."
    with_components = pipelines(doc_with_ents(pipelines, text, [("breast cancer", "Disease")])).ents[0]
    alone = linker_nlp(doc_with_ents(linker_nlp, text, [("breast cancer", "Disease")])).ents[0]
    assert with_components._.composite_parts is None and with_components._.long_form is None
    assert (with_components.kb_id_, with_components._.kb_ents) == (alone.kb_id_, alone._.kb_ents)
    assert with_components.kb_id_ == "D001943"


def test_composite_splitting_can_be_switched_off(pipelines):
    normalizer = pipelines.get_pipe("concept_normalizer")
    try:
        normalizer.cfg["split_composites"] = False
        text = "Germline BRCA1 mutations predispose to breast and ovarian cancer."
        ent = pipelines(doc_with_ents(pipelines, text, [("breast and ovarian cancer", "Disease")])).ents[0]
    finally:
        normalizer.cfg["split_composites"] = True
    assert "|" not in ent.kb_id_ and isinstance(ent._.kb_ents[0][0], str)
