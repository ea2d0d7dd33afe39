"""Clinical documents: the assertion status (`clinical_context`: medspaCy's PyRuSH, sectionizer and ConText), its
way into `annotate`'s outputs, and the `evaluate-assertion` command. The sentences and their statuses are written
by hand (tests/fixtures/clinical), a small entity_ruler stands in for the recognizer."""

import json
import sys

import pytest
import spacy
import srsly
from spacy.cli.package import get_meta
from spacy.language import Language
from spacy.tokens import Span
from typer.testing import CliRunner

from spacy_conceptnorm.about import __version__
from spacy_conceptnorm.annotate import annotate
from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.evaluation.assertion import evaluate_assertions, predict_statuses, read_annotated_spans
from spacy_conceptnorm.evaluation.gold import gold_linking_off
from spacy_conceptnorm.pipeline.clinical_context import (
    EXTRA_CUES,
    ClinicalContext,
    CueMatcher,
    token_pattern,
    written_out,
)

from .conftest import FIXTURES

pytest.importorskip("medspacy", reason="medspaCy is not installed (see .ci/run: the assertion extra and --no-deps)")

ASSERTIONS = FIXTURES / "clinical" / "assertions.jsonl"
TERMS = {"chest pain": "D002637", "fever": "D005334", "cough": "D003371", "breast cancer": "D001943",
         "pneumonia": "D011014", "migraine": "D008881", "headache": "D006261", "gout": "D006073",
         "asthma": "D001249", "diabetes": "D003920", "anemia": "D000740", "sepsis": "D018805"}  # fmt: skip
NOTE = (
    "HISTORY OF PRESENT ILLNESS: **NAME[AAA] denies chest pain but reports cough. Sepsis was ruled out.\n"
    "No headache. Migraine since May.\n"
    "PAST MEDICAL HISTORY:\n"
    "1. Asthma\n"
    "2. GOUT\n"
    "FAMILY HISTORY: Mother had breast cancer.\n"
    "PLAN: Screen for anemia. Return if pneumonia symptoms recur."
)


@Language.component("test_clinical_link")
def link(doc):
    """Link each entity to its TERMS id: a stand-in for concept_normalizer."""
    doc.ents = [Span(doc, e.start, e.end, e.label_, kb_id=TERMS.get(e.text.lower(), "NIL")) for e in doc.ents]
    return doc


def ruler_pipeline(terms=TERMS, context: bool = True) -> Language:
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns([{"label": "Disease", "pattern": t} for t in terms])
    nlp.add_pipe("test_clinical_link")
    if context:
        nlp.add_pipe("clinical_context")
    return nlp


@pytest.fixture(scope="module")
def nlp() -> Language:
    return ruler_pipeline()


def statuses(doc) -> dict[str, str]:
    return {ent.text: ent._.assertion for ent in doc.ents}


def test_note_statuses_scope_and_sections(nlp):
    doc = nlp(NOTE)
    assert statuses(doc) == {
        "chest pain": "negated",  # the cue before the entity
        "cough": "affirmed",  # ... its scope ends at "but"
        "Sepsis": "negated",  # the cue after the entity
        "headache": "negated",
        "Migraine": "affirmed",  # "No" ends with its sentence
        "Asthma": "historical",  # list items under a past-medical-history heading
        "GOUT": "historical",
        "breast cancer": "family",
        "anemia": "affirmed",  # PLAN: a new section, not family history any more
        "pneumonia": "hypothetical",  # "return if"
    }
    ents = {ent.text: ent for ent in doc.ents}
    # medspaCy's own attributes, as code written for medspaCy reads them
    assert ents["chest pain"]._.is_negated and not ents["cough"]._.is_negated
    assert ents["breast cancer"]._.is_family and ents["breast cancer"]._.section_category == "family_history"
    assert ents["pneumonia"]._.is_hypothetical and ents["pneumonia"]._.section_category == "observation_and_plan"
    assert ents["Asthma"]._.is_historical and ents["chest pain"]._.section_category == "history_of_present_illness"
    # the layout splits the sentences: headings and list items stand alone, the placeholder does not split one
    sents = [s.text.strip() for s in doc.sents if s.text.strip()]
    assert sents == [
        "HISTORY OF PRESENT ILLNESS:", "**NAME[AAA] denies chest pain but reports cough.", "Sepsis was ruled out.",
        "No headache.", "Migraine since May.", "PAST MEDICAL HISTORY:", "1. Asthma", "2. GOUT", "FAMILY HISTORY:",
        "Mother had breast cancer.", "PLAN:", "Screen for anemia.", "Return if pneumonia symptoms recur.",
    ]  # fmt: skip


def test_report_layout_cues_and_paragraphs():
    """ALL-CAPS report sentences, "X: no Y" and "Y: no", "possibly", "PMH of", a family history followed by a new
    paragraph without a heading."""
    terms = ["pleural effusion", "pneumothorax", "abscess", "diverticulosis", "diverticulitis", "edema", "fever",
             "pneumonia", "asthma", "gout", "breast cancer", "headache", "back pain"]  # fmt: skip
    nlp = ruler_pipeline({t: "NIL" for t in terms})
    report = (
        "LUNG BASES: NO PLEURAL EFFUSION OR PNEUMOTHORAX.\n"
        "BOWEL: THE APPENDIX IS DILATED TO 12 MM WITH FAT STRANDING. NO ABSCESS. SCATTERED DIVERTICULOSIS WITHOUT "
        "DIVERTICULITIS.\n"
    )
    assert statuses(nlp(report)) == {
        "PLEURAL EFFUSION": "negated",  # ": NO" reaches forward
        "PNEUMOTHORAX": "negated",
        "ABSCESS": "negated",
        "DIVERTICULOSIS": "affirmed",  # a sentence of its own, out of "NO"'s reach
        "DIVERTICULITIS": "negated",
    }
    doc = nlp("EXT: no edema.\nFever: no.\nAsthma, possibly pneumonia.\nPMH of gout.")
    assert statuses(doc) == {"edema": "negated", "Fever": "negated", "Asthma": "affirmed",
                             "pneumonia": "uncertain", "gout": "historical"}  # fmt: skip
    doc = nlp("FAMILY HISTORY: Mother had breast cancer. Father with headache.\n\nShe complains of back pain.")
    assert statuses(doc) == {"breast cancer": "family", "headache": "family", "back pain": "affirmed"}


def test_report_headings():
    """A radiology report's "HISTORY:" is the reason for the study, not a past history; "PSH:" is the past
    surgical history (medspaCy files it under social history) and "FH:" a family history."""
    nlp = ruler_pipeline({t: "NIL" for t in ["abdominal pain", "appendicitis", "cholecystitis", "gout"]})
    doc = nlp("HISTORY: ABDOMINAL PAIN.\nPSH: cholecystectomy for cholecystitis.\nFH: gout.\nIMPRESSION: APPENDICITIS.")
    assert statuses(doc) == {"ABDOMINAL PAIN": "affirmed", "cholecystitis": "historical", "gout": "family",
                             "APPENDICITIS": "affirmed"}  # fmt: skip


def test_whole_note_headings():
    """Headings on a line of their own without a colon, a blank line after them, and a heading's word inside a
    sentence, which is no heading: "seasonal allergies" stays affirmed, "Hives" under ALLERGIES is a reaction
    the drug would cause."""
    terms = ["hypertension", "breast cancer", "seasonal allergies", "hives", "gout", "migraine"]
    nlp = ruler_pipeline({t: "NIL" for t in terms})
    note = (
        "PAST MEDICAL HISTORY\n\nHypertension.\n\nFAMILY HISTORY\n\nBreast cancer.\n\n"
        "HISTORY OF PRESENT ILLNESS\n\nShe has seasonal allergies and gout.\n\nALLERGIES: penicillin - hives\n"
        "Meds: sumatriptan for migraine."
    )
    assert statuses(nlp(note)) == {"Hypertension": "historical", "Breast cancer": "family",
                                   "seasonal allergies": "affirmed", "gout": "affirmed", "hives": "hypothetical",
                                   "migraine": "affirmed"}  # fmt: skip


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Cardiovascular: Denies chest pain. Respiratory: cough.", {"chest pain": "negated", "cough": "affirmed"}),
        ("Abdomen soft, non-tender. Non-small cell lung cancer.", {"tender": "negated", "lung cancer": "affirmed"}),
        ("Alert staff in case of non-blanching rash, lethargy or seizure.",
         {"rash": "hypothetical", "lethargy": "hypothetical", "seizure": "hypothetical"}),
        ("The risks of surgery including infection, which may require another procedure, stroke or death were "
         "discussed.", {"infection": "hypothetical", "stroke": "hypothetical"}),
        ("The risks of anesthesia including but not limited to the risks of stroke and death.",
         {"stroke": "hypothetical"}),
        ("He has no joint damage due to his arthritis.", {"joint damage": "negated", "arthritis": "affirmed"}),
        ("I suspect a flare of gout. He thinks he has hematuria.", {"gout": "uncertain", "hematuria": "uncertain"}),
        ("Testing to determine if he has Lyme disease.", {"Lyme disease": "uncertain"}),
        ("Her colonoscopy 3 years ago showed diverticulosis.", {"diverticulosis": "historical"}),
        ("A two-day history of fever. She lost weight in the past 6 months.",
         {"fever": "affirmed", "weight": "affirmed"}),
        ("Her mother thought she felt hot. She was clinging to her mother and crying.",
         {"felt hot": "affirmed", "crying": "affirmed"}),
        ("Counsel parents on wound care.", {"wound": "hypothetical"}),
        ("• Constitutional: Negative for fever, chills\n• Skin: rash", {"fever": "negated", "chills": "negated",
                                                                        "rash": "affirmed"}),
        ("Negative Lachman test bilaterally. Positive McMurray test.", {"Lachman test": "negated",
                                                                        "McMurray test": "affirmed"}),
        ("#1 Metastatic disease, no evidence of recurrence\n#2 Gout, on treatment", {"recurrence": "negated",
                                                                                    "Gout": "affirmed"}),
        ("In March, he went to the emergency room for palpitations. She had an insect bite at her last visit.",
         {"palpitations": "historical", "insect bite": "historical"}),
        ("She presents for STD testing. We will screen her today for syphilis. His COVID test was positive.",
         {"STD": "uncertain", "syphilis": "uncertain", "COVID": "affirmed"}),
        ("He can take Tylenol for any pain. Call with any signs or symptoms of hypoglycemia.",
         {"pain": "hypothetical", "hypoglycemia": "hypothetical"}),
        # general practice's shorthand: "4/7 hx" (four days) and "Hx of X for a week" are the present complaint
        ("4/7 hx of sore throat and myalgia. HPC: 4-5 day hx runny nose.",
         {"sore throat": "affirmed", "myalgia": "affirmed", "runny nose": "affirmed"}),
        ("Hx of fever for a week with associated nausea.", {"fever": "affirmed", "nausea": "affirmed"}),
        ("PMHx - Asthma.\nFMH: Mum had breast cancer, now in remission.", {"Asthma": "historical",
                                                                           "breast cancer": "family"}),
        ("Review in 24-48 hours if sx not improving, or earlier if worsening sx (fever, vomiting).",
         {"fever": "hypothetical", "vomiting": "hypothetical"}),
        ("Discussed red flag sx (chest pain, fevers). S/e warned nausea.",
         {"chest pain": "hypothetical", "fevers": "hypothetical", "nausea": "hypothetical"}),
        ("Initial diarrhea - but now resolved. Felt dizzy this morning, but not now.",
         {"diarrhea": "negated", "dizzy": "negated"}),
        ("Imp: tension type headache +/- migraine", {"tension type headache": "affirmed", "migraine": "uncertain"}),
        # nursing notes' shorthand
        ("NO C/O CHEST PAIN. A-PACED W/O ECTOPY. Stool guaiac neg.",
         {"CHEST PAIN": "negated", "ECTOPY": "negated", "guaiac": "negated"}),
        ("Stool sent for c-diff. h-pylori pending. Denies orthopnea or PND.",
         {"c-diff": "uncertain", "h-pylori": "uncertain", "orthopnea": "negated", "PND": "negated"}),
        ("Aspiration precautions. Pain med prn. Keep pt free of ischemia. Paced to diminish chances of afib.",
         {"Aspiration": "hypothetical", "Pain": "hypothetical", "ischemia": "hypothetical", "afib": "hypothetical"}),
        ("Admitted for further w/u of tachycardia. Wheezing resolves with nebs.",
         {"tachycardia": "affirmed", "Wheezing": "negated"}),
        ("HO aware of hypotension. Family adamant that the drips stop after BP drop.",
         {"hypotension": "affirmed", "BP drop": "affirmed"}),
        # a "?" questions the word it is written against, else the words after it
        ("Increased sob, ?CHF. Source is urine? Rash over trunk from ? adhesive.",
         {"sob": "affirmed", "CHF": "uncertain", "urine": "uncertain", "Rash": "affirmed"}),
        ("Bruising R LQ-? more swollen.", {"Bruising": "affirmed", "swollen": "uncertain"}),
        # a negation ends where a nursing note's next clause starts with a measure; "s/p" of this admission
        ("NSR with no ectopy, BP high during transport. Admitted s/p GI bleed. Denies nausea, abd pain.",
         {"ectopy": "negated", "BP high": "affirmed", "GI bleed": "affirmed", "nausea": "negated",
          "abd pain": "negated"}),
        ("No spontaneous movement, does not follow commands. Suctioned old bloody sputum.",
         {"does not follow commands": "affirmed", "sputum": "affirmed"}),
        ("Extubated without incident, weak cough. No plans for surgery, hip fracture stable.",
         {"cough": "affirmed", "fracture": "affirmed"}),
        ("Lungs clear, no c/o SOB. diminished at bases.", {"SOB": "negated", "diminished": "affirmed"}),
        # a past history's list runs past ";", the other cues end there
        ("A 24 yr old with hx IDDM; obesity; asthma. No fever; cough.",
         {"IDDM": "historical", "obesity": "historical", "asthma": "historical", "fever": "negated",
          "cough": "affirmed"}),
        ("SBP dropped to 70s but recovered without intervention. Headache but resolved.",
         {"SBP dropped": "negated", "Headache": "negated"}),
        # a negation or uncertainty reaches over a list, not over a run-on line's other words
        ("not tolerating bipap well per resp at 2am and then became lethargic. Denies fever, chills, night sweats or "
         "rash.", {"lethargic": "affirmed", "fever": "negated", "rash": "negated"}),
        ("? pneumonia, team to reassess vent settings and wean sedation later this am, tachycardic at times.",
         {"pneumonia": "uncertain", "tachycardic": "affirmed"}),
        ("SR WO ECTOPY. tolerated w/o nausea, with out signs of reaction.",
         {"ECTOPY": "negated", "nausea": "negated", "reaction": "negated"}),
        ("Her tongue has stopped bleeding. CP was relieved. Stool OB (-). Apnea with resolution.",
         {"bleeding": "negated", "CP": "negated", "OB": "negated", "Apnea": "negated"}),
        ("C-diff sent. Follow closely for CP. Aspiration precaution.",
         {"C-diff": "uncertain", "CP": "hypothetical", "Aspiration": "hypothetical"}),
        # spaCy's tokens of "can't" and "cannot" ("ca n't", "can not")
        ("Pneumonia can't be excluded. An effusion cannot be entirely excluded.",
         {"Pneumonia": "uncertain", "effusion": "uncertain"}),
        # an absent function is a finding, whose "not" negates nothing after it
        ("Moves hands but not to command, gets restless. Cannot remember date, has difficulty finishing statements. "
         "W/o significant change neurologically - hand tremor.",
         {"restless": "affirmed", "difficulty finishing statements": "affirmed", "hand tremor": "affirmed"}),
    ],
)  # fmt: skip
def test_whole_note_cues(text, expected):
    """The constructions of whole notes that sentences written for the package lacked (docs/clinical.md)."""
    nlp = ruler_pipeline({term.lower(): "NIL" for term in expected})
    assert statuses(nlp(text)) == expected


def test_cue_words_make_token_patterns():
    within = {"IS_SENT_START": False}  # a cue's second token and on: not a sentence's first
    assert token_pattern("no significant|interval? change") == [
        {"LOWER": {"IN": ["no"]}},
        {"LOWER": {"IN": ["significant", "interval"]}, **within, "OP": "?"},
        {"LOWER": {"IN": ["change"]}, **within},
    ]
    assert token_pattern("?") == [{"LOWER": {"IN": ["?"]}}]
    assert token_pattern("in shape:dddd") == [{"LOWER": {"IN": ["in"]}}, {"SHAPE": {"IN": ["dddd"]}, **within}]
    assert token_pattern("shape:d|shape:dd") == [{"SHAPE": {"IN": ["d", "dd"]}}]
    with pytest.raises(ValueError, match="shapes or words"):
        token_pattern("shape:d|few")


def test_every_cue_word_is_one_of_spacys_tokens():
    """A cue word that spaCy's tokenizer splits ("work-up", a lower-case "cannot") would never match: write it as
    its tokens ("work - up"). Each word must be one token in lower case or in capitals ("CANNOT" is one)."""
    tokenizer = spacy.blank("en").tokenizer
    split = [
        (words, word)
        for _, _, words, *_ in EXTRA_CUES
        for token in words.split(" ")
        for word in token.removesuffix("?").split("|")
        if word
        and not word.startswith("shape:")
        and not any(len(tokenizer(form)) == 1 for form in (word, word.upper()))
    ]
    assert split == []


def test_token_patterns_of_words_are_written_out_as_phrases():
    pattern = [
        {"LOWER": "no"},
        {"LOWER": {"IN": ["new", "other"]}, "OP": "?"},
        {"LOWER": "evidence", "IS_SENT_START": False},
    ]
    assert written_out(pattern, 100) == {
        (False, False, True): [("no", "new", "evidence"), ("no", "other", "evidence")],
        (False, True): [("no", "evidence")],
    }
    assert written_out([{"LOWER": "in"}, {"SHAPE": "dddd"}], 100) is None  # not words
    many = [{"LOWER": {"IN": [str(i) for i in range(10)]}}] * 3
    assert written_out(many, 999) is None and len(written_out(many, 1000)[(False, False, False)]) == 1000


def test_cue_matcher_finds_the_cues_medspacys_matcher_finds():
    """The same rule, start and end for every cue in the note and the hand-written sentences, with the sentences
    the component splits."""
    from medspacy.common.medspacy_matcher import MedspacyMatcher

    nlp = spacy.blank("en")
    component = ClinicalContext(nlp)
    theirs = MedspacyMatcher(nlp)
    theirs.add(component.context.rules)
    texts = [NOTE] + [json.loads(line)["text"] for line in ASSERTIONS.read_text(encoding="utf-8").splitlines()]
    found = 0
    for text in texts:
        doc = component.sentencizer(nlp.make_doc(text))
        ours = [(id(rule), start, end) for rule, start, end in component.cues(doc)]
        expected = [(id(theirs.rule_map[nlp.vocab.strings[key]]), start, end) for key, start, end in theirs(doc)]
        assert sorted(ours) == sorted(expected), text
        found += len(ours)
    assert found > 100


def test_a_cue_does_not_reach_over_a_sentence_start():
    from spacy.tokens import Doc

    nlp = spacy.blank("en")
    cues = ClinicalContext(nlp).cues
    words = ["pain", "in", "the", "setting", "of", "trauma"]
    one = Doc(nlp.vocab, words=words, sent_starts=[True, False, False, False, False, False])
    two = Doc(nlp.vocab, words=words, sent_starts=[True, False, False, True, False, False])
    assert [(rule.literal, start, end) for rule, start, end in cues(one)] == [("in the? setting of", 1, 5)]
    assert cues(two) == []


def test_cue_matcher_refuses_rules_it_cannot_run():
    from medspacy.context import ConTextRule

    nlp = spacy.blank("en")
    with pytest.raises(ConceptNormError, match="E625"):
        CueMatcher(nlp.vocab, nlp.tokenizer, [ConTextRule("no+", "NEGATED_EXISTENCE", pattern=r"no+")])


def test_entities_and_links_are_left_as_they_were(nlp):
    without = ruler_pipeline(context=False)(NOTE)
    doc = nlp(NOTE)
    assert [(e.start_char, e.end_char, e.label_, e.kb_id_) for e in doc.ents] == [
        (e.start_char, e.end_char, e.label_, e.kb_id_) for e in without.ents
    ]


def test_hand_written_sentences(nlp):
    """Every span of the fixture gets the status written for it (the annotated spans made the entities)."""
    spans = read_annotated_spans(ASSERTIONS)
    by_text = {}
    for s in spans:
        by_text.setdefault(s.text, []).append(s)
    wrong = [
        (s.text[s.start : s.end], s.status, p)
        for text, group in by_text.items()
        for s, p in zip(group, predict_statuses(nlp, "clinical_context", text, group), strict=True)
        if p != s.status
    ]
    assert len(spans) == 123 and wrong == []


def _spans(records, path):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return read_annotated_spans(path)


def test_overlapping_spans_are_scored_apart(nlp, tmp_path):
    text = "Denies chest pain."
    spans = [
        {"text": text, "start": 7, "end": 17, "status": "negated"},
        {"text": text, "start": 13, "end": 17, "status": "negated"},  # "pain" inside "chest pain"
    ]
    result = evaluate_assertions(nlp, _spans(spans, tmp_path / "spans.jsonl"))
    assert result["accuracy"] == 1.0 and result["statuses"]["negated"]["support"] == 2


def test_evaluate_counts_by_hand(tmp_path):
    """Five spans: one status "wrong" (annotated uncertain, with no cue in the text), three recognized by the
    ruler (one of them only in part), all three linked, one of them right."""
    records = [
        {"text": "Denies chest pain.", "start": 7, "end": 17, "status": "negated", "concept_id": "D002637"},
        {"text": "Mother had breast cancer.", "start": 11, "end": 24, "status": "family", "concept_id": "D000001"},
        {"text": "Has chronic cough.", "start": 4, "end": 17, "status": "uncertain"},
        {"text": "Mild asthma.", "start": 5, "end": 11, "status": "affirmed"},
        {"text": "No pulmonary embolism.", "start": 3, "end": 21, "status": "negated"},
    ]
    nlp = ruler_pipeline(terms=["chest pain", "breast cancer", "cough"])
    result = evaluate_assertions(nlp, _spans(records, tmp_path / "spans.jsonl"))
    assert result["spans"] == 5 and result["accuracy"] == 4 / 5
    assert result["confusion"]["uncertain"] == {"affirmed": 1}
    negated, affirmed, uncertain = (result["statuses"][k] for k in ("negated", "affirmed", "uncertain"))
    assert (negated["support"], negated["precision"], negated["recall"]) == (2, 1.0, 1.0)
    assert (affirmed["support"], affirmed["predicted"], affirmed["precision"], affirmed["recall"]) == (1, 2, 0.5, 1.0)
    assert (uncertain["precision"], uncertain["recall"], uncertain["f1"]) == (0.0, 0.0, 0.0)
    assert result["recognition"] == {
        "recognized": 3,  # chest pain, breast cancer, "cough" inside "chronic cough"
        "exact": 2,
        "linked": 3,  # the stand-in linker links every entity the ruler found (cough too: D003371)
        "with_concept_id": 2,
        "recognized_with_concept_id": 2,
        "linked_right": 1,  # chest pain; breast cancer's annotated id is another
    }
    # the three found are conditions; "cough" has no cue for its annotated "uncertain"
    assert result["found"] == {"entities": 3, "conditions": 3, "status_right": 2}


def test_evaluate_counts_entities_on_no_annotated_span(tmp_path):
    """An entity found where nothing is annotated lowers the precision and has no status to be right or wrong."""
    text = "Denies fever. Discussed cough medicine."
    records = [{"text": text, "start": 7, "end": 12, "status": "negated"}]
    nlp = ruler_pipeline(terms=["fever", "cough"])
    result = evaluate_assertions(nlp, _spans(records, tmp_path / "spans.jsonl"))
    assert result["found"] == {"entities": 2, "conditions": 1, "status_right": 1}


def test_evaluate_assertion_cli(tmp_path, nlp):
    pipeline = tmp_path / "pipeline"
    ruler_pipeline(context=False).to_disk(pipeline)  # clinical_context is added by the command
    report = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["evaluate-assertion", str(pipeline), str(ASSERTIONS), "--output", str(report)])
    assert result.exit_code == 0, result.output
    assert "123 spans in 95 texts: accuracy 100.00" in result.output
    written = json.loads(report.read_text())
    assert written["statuses"]["negated"]["support"] == 34 and written["statuses"]["family"]["support"] == 8
    # the annotated spans whose text is one of TERMS: fever 7, chest pain 7, asthma 5, pneumonia 4, cough 4, anemia 2,
    # gout 2, breast cancer 2, migraine 2, sepsis 2, diabetes 2, headache 2
    assert written["recognition"]["exact"] == 41


def test_bad_assertion_records_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"text": "No fever.", "start": 3, "end": 8, "status": "negated"})
        + "\n"
        + json.dumps({"text": "No fever.", "start": 3, "end": 8, "status": "absent"})
        + "\n",
        encoding="utf-8",
    )
    with pytest.raises(ConceptNormError, match=r"E622.*bad.jsonl:2: .*'absent'"):
        read_annotated_spans(path)
    path.write_text(json.dumps({"text": "No fever.", "start": 3, "end": 12, "status": "negated"}) + "\n")
    with pytest.raises(ConceptNormError, match=r"E622.*:1: .*not a span of the 9-character text"):
        read_annotated_spans(path)
    path.write_text("\n")
    with pytest.raises(ConceptNormError, match="E623"):
        read_annotated_spans(path)


def test_a_whole_document_line_reads_as_its_spans(tmp_path):
    text = "No fever. Mother had breast cancer."
    one_a_line = [
        {"text": text, "start": 3, "end": 8, "status": "negated"},
        {"text": text, "start": 21, "end": 34, "status": "family", "id": "D001943"},
    ]
    whole = {"note": "n1", "text": text, "spans": [{k: v for k, v in s.items() if k != "text"} for s in one_a_line]}
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in one_a_line), encoding="utf-8")
    (tmp_path / "whole.jsonl").write_text(json.dumps(whole) + "\n", encoding="utf-8")
    by_span = read_annotated_spans(tmp_path / "spans.jsonl")
    by_document = read_annotated_spans(tmp_path / "whole.jsonl")
    assert [(s.text[s.start : s.end], s.status, s.concept_id) for s in by_document] == [
        ("fever", "negated", None),
        ("breast cancer", "family", "D001943"),
    ]
    assert [(s.start, s.end, s.status, s.concept_id) for s in by_document] == [
        (s.start, s.end, s.status, s.concept_id) for s in by_span
    ]
    whole["spans"][1]["status"] = "maternal"
    (tmp_path / "whole.jsonl").write_text(json.dumps(whole) + "\n", encoding="utf-8")
    with pytest.raises(ConceptNormError, match=r"E622.*whole.jsonl:1: .*'maternal'"):
        read_annotated_spans(tmp_path / "whole.jsonl")


def test_annotate_writes_the_status(tmp_path, nlp):
    pipeline = tmp_path / "pipeline"
    nlp.to_disk(pipeline)
    source = tmp_path / "in.jsonl"
    docs = [("n1", "Denies chest pain. Mother had breast cancer."), ("n2", "Return if fever recurs.")]
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), encoding="utf-8")
    annotate(pipeline, source, tmp_path / "out.jsonl", progress=False, n_process=2, batch_size=1)  # docs pickled
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [[(e["text"], e["concept_id"], e["assertion"]) for e in r["entities"]] for r in records] == [
        [("chest pain", "D002637", "negated"), ("breast cancer", "D001943", "family")],
        [("fever", "D005334", "hypothetical")],
    ]
    annotate(pipeline, source, tmp_path / "out.pubtator", progress=False)
    lines = [line.split("\t") for line in (tmp_path / "out.pubtator").read_text().splitlines() if "\t" in line]
    assert lines == [
        ["n1", "7", "17", "chest pain", "Disease", "D002637", "negated"],
        ["n1", "30", "43", "breast cancer", "Disease", "D001943", "family"],
        ["n2", "10", "15", "fever", "Disease", "D005334", "hypothetical"],
    ]


def test_needs_sentences_when_not_splitting():
    nlp = spacy.blank("en")
    context = ClinicalContext(nlp, split_sentences=False)
    with pytest.raises(ConceptNormError, match="E621"):
        context(nlp("No fever."))
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("clinical_context", config={"split_sentences": False})
    doc = nlp.make_doc("No fever. Has cough.")
    doc.ents = [doc.char_span(3, 8, label="Disease"), doc.char_span(14, 19, label="Disease")]
    doc = nlp.get_pipe("clinical_context")(nlp.get_pipe("sentencizer")(doc))
    assert statuses(doc) == {"fever": "negated", "cough": "affirmed"}


def test_missing_medspacy_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "medspacy.context", None)  # import medspacy.context now raises ImportError
    with pytest.raises(ConceptNormError, match=r"E620.*pip install --no-deps medspacy==1\.3\.1"):
        ClinicalContext(spacy.blank("en"))


def test_assemble_adds_clinical_context_where_medspacy_is_installed(tmp_path):
    config = tmp_path / "pipeline.cfg"
    config.write_text('[nlp]\nlang = "en"\npipeline = ["sentencizer"]\n\n[components]\n\n[components.sentencizer]\n'
                      'factory = "sentencizer"\n')  # fmt: skip
    for flags, expected in (([], ["sentencizer", "clinical_context"]), (["--no-clinical"], ["sentencizer"])):
        result = CliRunner().invoke(app, ["assemble", str(config), str(tmp_path / "out"), *flags])
        assert result.exit_code == 0, result.output
        assert spacy.load(tmp_path / "out").pipe_names == expected


def test_a_pipeline_with_clinical_context_declares_what_it_needs(tmp_path):
    """`spacy package` writes the saved meta's requirements into the wheel; medspaCy only where it does not pin
    spaCy below 3.8 (Python >= 3.12)."""
    config = tmp_path / "pipeline.cfg"
    config.write_text('[nlp]\nlang = "en"\npipeline = ["sentencizer"]\n\n[components]\n\n[components.sentencizer]\n'
                      'factory = "sentencizer"\n')  # fmt: skip
    assert CliRunner().invoke(app, ["assemble", str(config), str(tmp_path / "out")]).exit_code == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert meta["requirements"] == [f"spacy-conceptnorm[assertion]>={__version__}",
                                    'medspacy==1.3.1; python_version >= "3.12"',
                                    'PyRuSH==1.0.13; python_version >= "3.12"']  # fmt: skip
    packaged = get_meta(tmp_path / "out", {})  # the meta `spacy package` writes into the wheel
    assert packaged["requirements"][:3] == meta["requirements"]


def test_other_msgpack_files_read_back_with_medspacy_imported(nlp):
    """medspaCy registers msgpack decoders process-wide that took any dict with a "modifier" key for a ConText
    modifier (the lexical index's vocabulary has one): with clinical_context built they must read back as written."""
    for data in ({"modifier": 3, "cough": 1}, {"section": 5}, {"modifiers": [1, 2], "context_graph": 0}):
        assert srsly.msgpack_loads(srsly.msgpack_dumps(data)) == data


def test_linking_gold_mentions_turns_off_the_recognizers_and_clinical_context():
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("composite_splitter")
    nlp.add_pipe("clinical_context")
    assert gold_linking_off(nlp) == ["entity_ruler", "clinical_context"]


def test_rules_split_sentences_as_pyrush_does(nlp):
    """The default splitter (`sentences = "rules"`, text.sentences) finds PyRuSH's boundaries on a note, and the
    statuses are the same; PyRuSH stays behind the setting."""
    assert nlp.get_pipe_config("clinical_context")["sentences"] == "rules"
    pyrush = ruler_pipeline()
    pyrush.replace_pipe("clinical_context", "clinical_context", config={"sentences": "pyrush"})
    assert type(pyrush.get_pipe("clinical_context").sentencizer).__name__ == "PyRuSHSentencizer"
    for text in (NOTE, *(record["text"] for record in srsly.read_jsonl(ASSERTIONS))):
        ours, theirs = nlp(text), pyrush(text)
        assert [s.text.strip() for s in ours.sents if s.text.strip()] == [
            s.text.strip() for s in theirs.sents if s.text.strip()
        ], text
        assert statuses(ours) == statuses(theirs)


def test_rules_sentences_where_pyrush_misses_one(nlp):
    doc = nlp("Mild dehydration, approx 3%. Kawasaki disease unlikely at day 3 with no other criteria.")
    assert [s.text for s in doc.sents][0] == "Mild dehydration, approx 3%."
    doc = nlp("Seen by Dr. Smith, e.g. Fever. HTN\n2. DM\n- Gout noted")
    assert [s.text.strip() for s in doc.sents] == ["Seen by Dr. Smith, e.g. Fever.", "HTN", "2. DM", "- Gout noted"]


def test_sentences_setting_is_checked_and_defaults_in_saved_pipelines(tmp_path):
    with pytest.raises(ConceptNormError, match=r"E624.*pysbd.*rules, pyrush"):
        ClinicalContext(spacy.blank("en"), sentences="pysbd")
    with pytest.raises(Exception, match="sentences"):
        spacy.blank("en").add_pipe("clinical_context", config={"sentences": "pysbd"})
    nlp = spacy.blank("en")
    nlp.add_pipe("clinical_context")
    nlp.to_disk(tmp_path / "p")
    config = (tmp_path / "p" / "config.cfg").read_text()
    (tmp_path / "p" / "config.cfg").write_text(config.replace('sentences = "rules"\n', ""))
    assert "\nsentences =" not in (tmp_path / "p" / "config.cfg").read_text()  # a config saved before the key
    loaded = spacy.load(tmp_path / "p")
    assert loaded.get_pipe_config("clinical_context")["sentences"] == "rules"
    assert [s.text for s in loaded("No fever. Has cough.").sents] == ["No fever.", "Has cough."]


class _KBPipe:
    """A stand-in for concept_normalizer: a pipe with a KB that clinical_findings looks its concepts up in."""

    def __init__(self, kb):
        self.kb = kb

    def __call__(self, doc):
        return doc


def test_clinical_findings_adds_the_findings_no_entity_holds(tmp_path):
    """Findings become entities linked to the concept of their listed KB name (NIL where the KB has none), not
    where an entity overlaps them; "-" takes a finding out; the concepts found are saved with the pipeline."""
    from spacy_conceptnorm.kb.concept import Concept
    from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase

    kb = KnowledgeBase()
    kb.add_concept(Concept("D006337", "Heart Murmurs"), ["Heart Murmur"])
    kb.add_concept(Concept("D010292", "Paresthesia"), [])
    Language.component("test_kb_pipe", func=_KBPipe(kb))
    nlp = ruler_pipeline({"chest pain": "D002637"}, context=False)
    nlp.add_pipe("test_kb_pipe", first=True)
    nlp.add_pipe("clinical_findings", config={"findings": {"crepitus": None, "tenderness": "-"}})
    nlp.get_pipe("clinical_findings").initialize(nlp=nlp)
    doc = nlp("Chest pain. No murmurs, rubs or gallops. JVD absent. Tingling, crepitus and tenderness.")
    assert [(e.text, e.kb_id_, e._.kb_stage) for e in doc.ents] == [
        ("Chest pain", "D002637", None), ("murmurs", "D006337", "clinical_findings"),
        ("rubs", "NIL", "clinical_findings"), ("gallops", "NIL", "clinical_findings"),
        ("JVD", "NIL", "clinical_findings"), ("Tingling", "D010292", "clinical_findings"),
        ("crepitus", "NIL", "clinical_findings"),
    ]  # fmt: skip
    assert doc.ents[1]._.kb_ents == [("D006337", 1.0)] and doc.ents[2]._.kb_ents == []
    nlp.remove_pipe("test_kb_pipe")
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert [e.kb_id_ for e in loaded("Wheezes and murmurs.").ents] == ["NIL", "D006337"]
    (tmp_path / "p" / "clinical_findings" / "concepts.json").write_text("[1, 2]")
    with pytest.raises(ConceptNormError, match=r"E413.*concepts\.json"):
        spacy.load(tmp_path / "p")


@Language.component("test_wrong_link")
def wrong_link(doc):
    """Link "cp" as MEDIC's "CP" (cleft palate) and every other entity NIL: a linker that reads no context."""
    doc.ents = [Span(doc, e.start, e.end, e.label_, kb_id="D002972" if e.text == "cp" else "NIL") for e in doc.ents]
    return doc


def test_clinical_findings_links_an_entity_that_is_a_shorthand_item_as_the_item():
    """An entity that is an item of a shorthand list takes the item's concept ("cp" of "cp/sob" is chest pain);
    the same word outside a list keeps its link."""
    from spacy_conceptnorm.kb.concept import Concept
    from spacy_conceptnorm.kb.knowledge_base import KnowledgeBase

    kb = KnowledgeBase()
    kb.add_concept(Concept("D002637", "Chest Pain"), [])
    kb.add_concept(Concept("D004417", "Dyspnea"), [])
    Language.component("test_kb_pipe_shorthand", func=_KBPipe(kb))
    nlp = spacy.blank("en")
    nlp.add_pipe("test_kb_pipe_shorthand")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": w} for w in ("cp", "sob")])
    nlp.add_pipe("test_wrong_link")
    nlp.add_pipe("clinical_findings").initialize(nlp=nlp)
    doc = nlp("Denies cp/sob. Hx of cp since birth.")
    assert [(e.text, e.kb_id_, e._.kb_name, e._.kb_ents) for e in doc.ents] == [
        ("cp", "D002637", "chest pain", [("D002637", 1.0)]), ("sob", "D004417", "dyspnea", [("D004417", 1.0)]),
        ("cp", "D002972", None, None),
    ]  # fmt: skip


def test_clinical_findings_reads_shorthand_lists_and_phrases():
    """Each item of a shorthand list of findings is one; a list with another item ("c/d/i": clean, dry, intact) or
    of only ambiguous items ("d/c": discharge) is none; the phrases of the patterns are findings whole."""
    nlp = spacy.blank("en")
    nlp.add_pipe("clinical_findings")
    text = (
        "CV: No m/r/g. ROS: denies n/v/d. Wound c/d/i, d/c home. Blood in her stool, difficulty swallowing, "
        "her blood pressure was still elevated and decreased range of motion."
    )
    # spaCy's English tokenizer keeps a single letter's full stop: "g.", "d."
    assert [e.text for e in nlp(text).ents] == [
        "m", "r", "g.", "n", "v", "d.", "Blood in her stool", "difficulty swallowing",
        "blood pressure was still elevated", "decreased range of motion",
    ]  # fmt: skip
    text = (
        "She has carotid disease and some abdominal issues, no suicidal or homicidal ideation, and elevations in "
        "her blood pressure. The disease is stable; no issues with insurance."
    )
    assert [e.text for e in nlp(text).ents] == [
        "carotid disease", "abdominal issues", "suicidal or homicidal ideation", "elevations in her blood pressure",
    ]  # fmt: skip


def test_clinical_findings_removes_condition_words_of_another_sense():
    """A title, the Allergies heading and a word that names a place or a product with the noun after it are not
    conditions, whatever the KB says; the same words as conditions stay."""
    nlp = ruler_pipeline(["emergency", "shingles", "allergies", "mrs", "cough", "ext"], context=False)
    nlp.add_pipe("clinical_findings")
    text = "ALLERGIES\nNone.\nMrs X came to the emergency room for cough; shingles vaccine given. Has shingles."
    assert [e.text for e in nlp(text).ents] == ["cough", "shingles"]
    assert [e.text for e in nlp("She denies allergies.").ents] == ["allergies"]
    assert [e.text for e in nlp("Allergies: none.").ents] == []
    assert [e.text for e in nlp("Ext: no cough. EXT gene.").ents] == ["cough", "EXT"]  # a label before a colon


def test_clinical_findings_removes_a_notes_shorthand_and_finds_general_practice_words():
    """The shorthand of a note's parts and measures is no condition, whatever the KB names by it (FH: familial
    hypercholesterolemia, LMP, HPC in MEDIC); general practice's words for findings are found."""
    nlp = ruler_pipeline(["fh", "lmp", "hpc", "hrs", "cough"], context=False)
    nlp.add_pipe("clinical_findings")
    doc = nlp("HPC: cough for 48 hrs, wheezy, feeling sick, N&V and tired. FH: nil. LMP 2 weeks ago.")
    assert [e.text for e in doc.ents] == ["cough", "wheezy", "feeling sick", "N&V"]
    # a nursing note's shorthand for routine care: bowel movement, blood pressure, nitroglycerin (BS, NTG in MEDIC)
    nlp = ruler_pipeline(["bm", "bp", "bs", "ntg", "hypotension"], context=False)
    nlp.add_pipe("clinical_findings")
    assert [e.text for e in nlp("No BM. BP low, hypotension on NTG, + BS.").ents] == ["hypotension"]
    nlp = ruler_pipeline(["nkda", "nsr", "pad", "c", "n", "lung sounds", "rhonchi"], context=False)
    nlp.add_pipe("clinical_findings")
    text = "NKDA. NSR, PAD 25-28, on 2L n/c. Lung sounds with rhonchi. Hx of PAD."
    assert [e.text for e in nlp(text).ents] == ["rhonchi", "PAD"]
    # a normal function charted, and a specimen: no condition; sputum coughed up is one
    nlp = ruler_pipeline(["flatus", "sputum"], context=False)
    nlp.add_pipe("clinical_findings")
    text = "+flatus. Sputum cx sent, MRSA in sputum. Suctioned thick sputum."
    assert [(e.text, e.start_char) for e in nlp(text).ents] == [("sputum", text.rindex("sputum"))]


def test_clinical_findings_removes_the_names_of_procedures():
    """A condition word before a procedure's noun, or an entity that ends in one, names the procedure."""
    nlp = ruler_pipeline(["cataract", "carpal tunnel release", "carpal tunnel", "tumor", "aneurysm"], context=False)
    nlp.add_pipe("clinical_findings")
    text = "S/p cataract surgery and carpal tunnel release; tumor resection. Now a cataract, carpal tunnel and a tumor."
    assert [e.text for e in nlp(text).ents] == ["cataract", "carpal tunnel", "tumor"]
    assert [e.text for e in nlp("Aneurysm repair in 2013.").ents] == []


def test_clinical_findings_removes_single_letters_but_finds_shorthand_items():
    nlp = ruler_pipeline(["h", "v", "gout"], context=False)
    nlp.add_pipe("clinical_findings")
    assert [e.text for e in nlp("72 yo M, h/o gout; denies n/v today.").ents] == ["gout", "n", "v"]


def test_clinical_findings_setting_is_checked():
    with pytest.raises(ConceptNormError, match=r"E410.*findings"):
        spacy.blank("en").add_pipe("clinical_findings", config={"findings": {" ": None}})
