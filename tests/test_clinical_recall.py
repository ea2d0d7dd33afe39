"""Recall on clinical notes: the clinical abbreviations of `abbreviation_resolver`, the `names` merge of the
`dictionary_matcher`, the exact names of `link_filter` and the settings that turn them on for clinical notes. The
texts are written for these tests; the expected values are worked out by hand."""

import spacy

from spacy_conceptnorm.text.abbreviations import CLINICAL_ABBREVIATIONS


def _resolve(text, ents=(), **config):
    nlp = spacy.blank("en")
    resolver = nlp.add_pipe("abbreviation_resolver", config=config)
    doc = nlp.make_doc(text)
    doc.ents = [doc.char_span(text.index(e), text.index(e) + len(e), label="Disease") for e in ents]
    doc = resolver(doc)
    return [(e.text, e.label_, e._.long_form) for e in doc.ents]


def test_undefined_clinical_abbreviations_become_entities():
    text = "65 year old man with CHF and DM2 who presents with SOB. SOBER now."
    assert _resolve(text) == [
        ("CHF", "Disease", "congestive heart failure"),
        ("DM2", "Disease", "type 2 diabetes mellitus"),
        ("SOB", "Disease", "shortness of breath"),  # not "SOBER": whole tokens only
    ]
    assert _resolve(text, clinical_abbreviations=False) == []


def test_an_entity_holding_a_clinical_abbreviation_is_expanded_not_split():
    assert _resolve("Admitted for CHF exacerbation and recurrent UTIs.", ents=["CHF exacerbation"]) == [
        ("CHF exacerbation", "Disease", "congestive heart failure exacerbation"),
        ("UTIs", "Disease", "urinary tract infection"),  # the plural, as for a defined short form
    ]


def test_a_definition_in_the_text_wins_over_the_list():
    text = "Coronary artery dilatation (CAD) was seen. CAD resolved."
    # both CADs take the text's long form; the one inside the definition is not a new entity
    assert _resolve(text, ents=["Coronary artery dilatation"]) == [
        ("Coronary artery dilatation", "Disease", None),
    ]
    text = "Coronary artery dilatation (CAD) was seen. HTN and CAD resolved."
    assert _resolve(text, ents=["Coronary artery dilatation", "CAD resolved"]) == [
        ("Coronary artery dilatation", "Disease", None),
        ("HTN", "Disease", "hypertension"),
        ("CAD resolved", "Disease", "Coronary artery dilatation resolved"),
    ]


def test_the_list_leaves_out_ambiguous_short_forms():
    assert {"PE", "RA", "MS", "DM", "DM1"}.isdisjoint(CLINICAL_ABBREVIATIONS)
    assert _resolve("PE: lungs clear. DM noted.") == []
