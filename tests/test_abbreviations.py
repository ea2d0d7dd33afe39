"""Tests of the abbreviation detector and the `abbreviation_resolver` component.

The texts are copied from the NCBI-disease corpus (PMID in each name) unless a comment says otherwise.
"""

import sys

import pytest
import spacy
from spacy.tokens import DocBin

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.text import abbreviations
from spacy_conceptnorm.text.abbreviations import Abbreviation, find_abbreviations, is_short_form

# PMID 8782829 (develop set): "long form (SF)".
MSH3_TEXT = (
    "Although this microsatellite instability has been attributed to mutations in four DNA mismatch repair genes in "
    "hereditary nonpolyposis colorectal cancer (HNPCC) kindreds, many sporadic tumours exhibit instability but no "
    "detectable mutations in these genes."
)
# PMID 10051005: title, then abstract sentences; HNPCC is used in the title before the abstract defines it.
MSH2_TEXT = (
    "A common MSH2 mutation in English and North American HNPCC families: origin, phenotypic expression, and sex "
    "specific differences in colorectal cancer.\nThe frequency, origin, and phenotypic expression of a germline MSH2 "
    "gene mutation previously identified in seven kindreds with hereditary non-polyposis cancer syndrome (HNPCC) was "
    "investigated. Although this mutation was initially detected in four of 33 colorectal cancer families analysed "
    "from eastern England, more extensive analysis has reduced the frequency to four of 52 (8%) English HNPCC "
    "kindreds analysed."
)
MSH2_LONG = "hereditary non-polyposis cancer syndrome"
# PMID 10470088: "SF (long form)", and APC used with no definition.
APC_TEXT = (
    "Truncating germline and somatic mutations (or, infrequently, allelic loss) occur in tumors in FAP (familial "
    "adenomatous polyposis). Most sporadic colorectal cancers also have two APC mutations. A different "
    "germline-somatic APC mutation association exists in FAP desmoids."
)
APC_MENTIONS = [
    "tumors",
    "FAP",
    "familial adenomatous polyposis",
    "sporadic colorectal cancers",
    "APC",
    "APC",
    "FAP desmoids",
]
# Parentheses that define nothing.
UNCHANGED_TEXTS = [
    # PMID 10051005
    "To investigate the origin of this mutation in colorectal cancer families from England (n = 4), Newfoundland "
    "(n = 10), and the United States (n = 3), haplotype analysis using microsatellite markers linked to MSH2 was "
    "performed.",
    # PMID 10051005
    "The risk of colorectal cancer was significantly higher (p < 0. 01) in males than females.",
    # PMID 10051005
    "In contrast, a common haplotype was identified at the two flanking markers (CA5 and D2S288) in eight of the "
    "Newfoundland families.",
    # NCBI-disease (train): a citation
    "Deficiency of APRT in combination with HPRT-deficiency in mice may lead to self-mutilation behavior [C. L. Wu "
    "and D. W. Melton (1993) Nature Genet. 3, 235-240].",
    # written for this test
    "Mutation carriers developed colorectal cancer at an earlier age (Fig. 2).",
]


def _set_ents(doc, mentions, label="Disease"):
    """Set doc.ents to the given mention strings, found left to right in the text."""
    spans, position = [], 0
    for mention in mentions:
        start = doc.text.index(mention, position)
        spans.append(doc.char_span(start, start + len(mention), label=label))
        position = start + len(mention)
    doc.ents = spans
    return doc


@pytest.fixture
def nlp():
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver")
    return nlp


def _run(nlp, text, mentions, label="Disease"):
    doc = _set_ents(nlp.make_doc(text), mentions, label)
    for _, component in nlp.pipeline:
        doc = component(doc)
    return doc


def test_long_form_then_short_form():
    found = find_abbreviations(MSH3_TEXT)
    assert found == [
        Abbreviation(
            short="HNPCC",
            long="hereditary nonpolyposis colorectal cancer",
            short_start=MSH3_TEXT.index("HNPCC"),
            short_end=MSH3_TEXT.index("HNPCC") + 5,
            long_start=MSH3_TEXT.index("hereditary"),
            long_end=MSH3_TEXT.index(" (HNPCC"),
        )
    ]


def test_short_form_then_long_form():
    (found,) = find_abbreviations(APC_TEXT)
    assert (found.short, found.long) == ("FAP", "familial adenomatous polyposis")
    assert APC_TEXT[found.short_start : found.short_end] == "FAP"
    assert APC_TEXT[found.long_start : found.long_end] == "familial adenomatous polyposis"
    assert found.short_start < found.long_start


@pytest.mark.parametrize(
    "text,short,long",
    [
        ("alpha chi (AC) was seen.", "AC", "alpha chi"),  # 2 words: within min(2 + 5, 2 * 2) = 4
        ("alpha beta gamma delta epsilon chi (AC) was seen.", None, None),  # 6 words: too long
        ("Vascular ischemia (AI) was seen.", None, None),  # "A" matches no word start
        ("FAP syndrome (FAP) was seen.", None, None),  # the long form holds the short form
        ("Previously, familial adenomatous polyposis (FAP; ref. 3) was seen.", "FAP", "familial adenomatous polyposis"),
        ("patients with ataxia-telangiectasia (A-T) were seen.", "A-T", "ataxia-telangiectasia"),
    ],
)
def test_schwartz_hearst_rules(text, short, long):
    found = [(a.short, a.long) for a in find_abbreviations(text)]
    assert found == ([(short, long)] if short else [])


@pytest.mark.parametrize(
    "text,valid",
    [
        ("HNPCC", True),
        ("A-T", True),
        ("MPS IVA", True),
        ("A", False),
        ("ABCDEFGHIJK", False),
        ("1998", False),
        ("-AB", False),
        ("p < 0. 01", False),
    ],
)
def test_is_short_form(text, valid):
    assert is_short_form(text) is valid


def test_component_propagates_to_every_occurrence(nlp):
    mentions = ["HNPCC families", "colorectal cancer", MSH2_LONG, "HNPCC", "colorectal cancer", "HNPCC"]
    doc = _run(nlp, MSH2_TEXT, mentions)
    definition = MSH2_TEXT.index("(HNPCC)") + 1
    assert doc._.abbreviations == [
        {
            "short": "HNPCC",
            "long": MSH2_LONG,
            "short_start": definition,
            "short_end": definition + 5,
            "long_start": MSH2_TEXT.index(MSH2_LONG),
            "long_end": MSH2_TEXT.index(MSH2_LONG) + len(MSH2_LONG),
        }
    ]
    assert [ent._.long_form for ent in doc.ents] == [
        f"{MSH2_LONG} families",  # before the definition, and inside a longer entity
        None,
        None,
        MSH2_LONG,  # the defining occurrence
        None,
        MSH2_LONG,  # a later occurrence
    ]


def test_component_without_propagation_expands_only_the_definition():
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver", config={"propagate": False})
    doc = _run(nlp, MSH2_TEXT, ["HNPCC", MSH2_LONG, "HNPCC", "HNPCC"])
    assert [ent._.long_form for ent in doc.ents] == [None, None, MSH2_LONG, None]


def test_component_matches_whole_tokens_and_plurals(nlp):
    # MSH3_TEXT, then a sentence written for this test
    text = MSH3_TEXT + " HNPCC2 tumours differ from HNPCCs and from HNPCC-associated tumours."
    doc = _run(nlp, text, ["HNPCC2 tumours", "HNPCCs", "HNPCC-associated tumours"])
    long = "hereditary nonpolyposis colorectal cancer"
    assert [ent._.long_form for ent in doc.ents] == [None, long, f"{long}-associated tumours"]


def test_entity_holding_a_whole_definition_is_not_expanded(nlp):
    doc = _run(nlp, MSH3_TEXT, ["hereditary nonpolyposis colorectal cancer (HNPCC) kindreds"])
    assert doc.ents[0]._.long_form is None


@pytest.mark.parametrize("text", UNCHANGED_TEXTS)
def test_nothing_changes_without_definitions(text):
    assert find_abbreviations(text) == []
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver", config={"expand_undefined_uppercase": True})
    doc = _set_ents(nlp.make_doc(text), ["colorectal cancer"] if "colorectal cancer" in text else [])
    tokens, ents, user_data = [t.text for t in doc], [(e.start, e.end, e.label_) for e in doc.ents], dict(doc.user_data)
    doc = nlp.get_pipe("abbreviation_resolver")(doc)
    assert doc._.abbreviations == []
    assert [t.text for t in doc] == tokens
    assert [(e.start, e.end, e.label_) for e in doc.ents] == ents
    assert {k: v for k, v in doc.user_data.items() if k[1] != "abbreviations"} == user_data


def test_component_keeps_tokens_and_ents(nlp):
    doc = _set_ents(nlp.make_doc(MSH2_TEXT), ["HNPCC", MSH2_LONG, "HNPCC"])
    tokens, ents = [t.text for t in doc], [(e.start, e.end, e.label_) for e in doc.ents]
    doc = nlp.get_pipe("abbreviation_resolver")(doc)
    assert [t.text for t in doc] == tokens
    assert [(e.start, e.end, e.label_) for e in doc.ents] == ents
    assert doc.ents[0]._.long_form == MSH2_LONG


def test_uppercase_fallback_off_by_default(nlp):
    doc = _run(nlp, APC_TEXT, APC_MENTIONS)
    expected = [
        None,
        "familial adenomatous polyposis",
        None,
        None,
        None,
        None,
        "familial adenomatous polyposis desmoids",
    ]
    assert [ent._.long_form for ent in doc.ents] == expected


def test_uppercase_fallback_uses_previous_entity_of_same_label():
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver", config={"expand_undefined_uppercase": True})
    doc = _run(nlp, APC_TEXT, APC_MENTIONS)
    long_forms = {(ent.start_char, ent.text): ent._.long_form for ent in doc.ents}
    apcs = [long_form for (_, text), long_form in long_forms.items() if text == "APC"]
    # Both APCs take the entity before the first one; FAP keeps its definition.
    assert apcs == ["sporadic colorectal cancers", "sporadic colorectal cancers"]
    assert doc.ents[1]._.long_form == "familial adenomatous polyposis"
    # With another label before it, there is nothing to expand from.
    doc = nlp.make_doc(APC_TEXT)
    start = APC_TEXT.index("APC")
    doc.ents = [doc.char_span(start, start + 3, label="Modifier")]
    assert nlp.get_pipe("abbreviation_resolver")(doc).ents[0]._.long_form is None


@pytest.mark.parametrize("config", [{"detector": "regex"}, {"detector": ""}])
def test_bad_config_raises(config):
    nlp = spacy.blank("en")
    with pytest.raises(ConceptNormError, match="detector"):
        nlp.add_pipe("abbreviation_resolver", config=config)


def test_ab3p_detector():
    pytest.importorskip("pyab3p")
    text = MSH3_TEXT.replace("nonpolyposis colorectal", "nonpolyposis  colorectal")  # a double space
    (found,) = abbreviations.find_abbreviations_ab3p("Ünïcode first. " + text)
    assert found.short == "HNPCC"
    assert found.long == "hereditary nonpolyposis  colorectal cancer"
    source = "Ünïcode first. " + text
    assert source[found.long_start : found.long_end] == found.long
    assert source[found.short_start : found.short_end] == "HNPCC"
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver", config={"detector": "ab3p"})
    doc = _run(nlp, MSH2_TEXT, ["HNPCC", MSH2_LONG, "HNPCC", "HNPCC"])
    assert [ent._.long_form for ent in doc.ents] == [MSH2_LONG, None, MSH2_LONG, MSH2_LONG]


def test_ab3p_missing_raises_import_error(monkeypatch):
    abbreviations.load_ab3p.cache_clear()
    monkeypatch.setitem(sys.modules, "pyab3p", None)  # makes `import pyab3p` fail
    try:
        with pytest.raises(ImportError, match="pip install pyab3p"):
            spacy.blank("en").add_pipe("abbreviation_resolver", config={"detector": "ab3p"})
    finally:
        abbreviations.load_ab3p.cache_clear()


def test_docbin_round_trip(nlp):
    doc = _run(nlp, MSH2_TEXT, ["HNPCC families", MSH2_LONG, "HNPCC"])
    doc_bin = DocBin(store_user_data=True)
    doc_bin.add(doc)
    (loaded,) = DocBin().from_bytes(doc_bin.to_bytes()).get_docs(spacy.blank("en").vocab)
    # DocBin reads lists back as tuples (spaCy loads user_data with msgpack's use_list=False).
    assert list(loaded._.abbreviations) == doc._.abbreviations
    assert loaded._.abbreviations[0]["short"] == "HNPCC"
    assert [ent._.long_form for ent in loaded.ents] == [f"{MSH2_LONG} families", None, MSH2_LONG]


def _ruler_pipeline(**config):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in ("HNPCC", MSH2_LONG, "colorectal cancer")])
    nlp.add_pipe("abbreviation_resolver", config=config)
    return nlp


def test_pipe_with_two_processes():
    nlp = _ruler_pipeline()
    texts = [MSH2_TEXT, UNCHANGED_TEXTS[1]]
    first, second = nlp.pipe(texts, n_process=2, batch_size=1)
    assert first._.abbreviations[0]["long"] == MSH2_LONG
    assert [ent._.long_form for ent in first.ents if ent.text == "HNPCC"] == [MSH2_LONG] * 3
    assert second._.abbreviations == []
    assert [ent._.long_form for ent in second.ents] == [None]


def test_config_round_trips_through_disk(tmp_path):
    nlp = _ruler_pipeline(propagate=False, expand_undefined_uppercase=True)
    nlp.to_disk(tmp_path)
    loaded = spacy.load(tmp_path)
    resolver = loaded.get_pipe("abbreviation_resolver")
    assert (resolver.detector, resolver.propagate, resolver.expand_undefined_uppercase) == (
        "schwartz_hearst",
        False,
        True,
    )
    assert loaded.config["components"]["abbreviation_resolver"] == nlp.config["components"]["abbreviation_resolver"]
    doc, loaded_doc = nlp(MSH2_TEXT), loaded(MSH2_TEXT)
    assert [e._.long_form for e in loaded_doc.ents] == [e._.long_form for e in doc.ents]
    assert [e._.long_form for e in loaded_doc.ents if e.text == "HNPCC"] == [None, MSH2_LONG, None]
