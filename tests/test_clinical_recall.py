"""Recall on clinical notes: the clinical abbreviations of `abbreviation_resolver`, the `names` merge of the
`dictionary_matcher`, the exact names of `link_filter` and the settings that turn them on for clinical notes. The
texts are written for these tests; the expected values are worked out by hand."""

import json

import pytest
import spacy
from spacy.tokens import Span
from typer.testing import CliRunner

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.evaluation.assertion import evaluate_assertions, read_annotated_spans
from spacy_conceptnorm.pipeline.clinical_abbreviations import CLINICAL_ABBREVIATIONS
from spacy_conceptnorm.pipeline.clinical_context import medspacy_available
from spacy_conceptnorm.pipeline.clinical_settings import CLINICAL_SETTINGS, clinical_overrides, use_clinical_settings
from spacy_conceptnorm.pipeline.dictionary_matcher import DictionaryMatcher
from spacy_conceptnorm.pipeline.link_filter import LinkFilter

for _name in ("kb_ents", "kb_confidence"):  # set by concept_normalizer, which these tests leave out
    if not Span.has_extension(_name):
        Span.set_extension(_name, default=None)


def _resolve(text, ents=(), clinical=True):
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver")
    if clinical:
        nlp.add_pipe("clinical_abbreviations")
    doc = nlp.make_doc(text)
    doc.ents = [doc.char_span(text.index(e), text.index(e) + len(e), label="Disease") for e in ents]
    for _, component in nlp.pipeline:
        doc = component(doc)
    return [(e.text, e.label_, e._.long_form) for e in doc.ents]


def test_undefined_clinical_abbreviations_become_entities():
    text = "65 year old man with CHF and DM2 who presents with SOB. SOBER now."
    assert _resolve(text) == [
        ("CHF", "Disease", "congestive heart failure"),
        ("DM2", "Disease", "type 2 diabetes mellitus"),
        ("SOB", "Disease", "shortness of breath"),  # not "SOBER": whole tokens only
    ]
    assert _resolve(text, clinical=False) == []


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
    nlp = spacy.blank("en")  # without the resolver before it, it finds the definitions itself
    nlp.add_pipe("clinical_abbreviations")
    assert [(e.text, e._.long_form) for e in nlp(text).ents] == [("HTN", "hypertension")]


def test_your_own_abbreviations_add_to_the_list_and_take_out_of_it(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver")
    own = {"ESRD": "end stage renal disease", "SOB": None, "CHF": "heart failure"}
    nlp.add_pipe("clinical_abbreviations", config={"abbreviations": own})
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")  # the setting travels in the config
    doc = loaded("Known ESRD and CHF, now SOB and HTN.")
    assert [(e.text, e._.long_form) for e in doc.ents] == [
        ("ESRD", "end stage renal disease"),
        ("CHF", "heart failure"),
        ("HTN", "hypertension"),  # the list's own, kept
    ]
    with pytest.raises(ConceptNormError, match="abbreviations must be"):
        nlp.add_pipe("clinical_abbreviations", name="bad", config={"abbreviations": {" ": "pneumonia"}})


def test_the_list_leaves_out_ambiguous_short_forms():
    assert {"PE", "RA", "MS", "DM", "DM1"}.isdisjoint(CLINICAL_ABBREVIATIONS)
    assert _resolve("PE: lungs clear. DM noted.") == []


def test_names_merge_puts_the_names_inside_an_entity_in_its_place():
    nlp = spacy.blank("en")
    text = "Complaints of shortness of breath and leg edema. Shortness of breath again."
    doc = nlp.make_doc(text)
    doc.ents = [doc.char_span(0, 47, label="Disease"), doc.char_span(49, 68, label="Disease")]
    names = ["shortness of breath", "edema"]
    longest = DictionaryMatcher(nlp.vocab, merge="longest")
    longest.set_names(names)
    assert [e.text for e in longest(doc.copy()).ents] == [text[:47], "Shortness of breath"]
    matcher = DictionaryMatcher(nlp.vocab, merge="names")
    matcher.set_names(names)
    doc = matcher(doc)
    # the second entity is a name itself: it stays, as the recognizer's
    assert [e.text for e in doc.ents] == ["shortness of breath", "edema", "Shortness of breath"]
    assert [s.text for s in doc.spans["dictionary"]] == ["shortness of breath", "edema"]


def _linked(nlp, text, links):
    """A doc whose entities (text -> (kb_id, kb_ents, confidence)) the dictionary_matcher added, all of them."""
    doc = nlp.make_doc(text)
    ents = []
    for mention, (kb_id, _, _) in links.items():
        span = doc.char_span(text.index(mention), text.index(mention) + len(mention))
        ents.append(Span(doc, span.start, span.end, "Disease", kb_id=kb_id))
    doc.ents = ents
    for ent, (_, candidates, confidence) in zip(doc.ents, links.values(), strict=True):
        ent._.kb_ents, ent._.kb_confidence = candidates, confidence
    doc.spans["dictionary"] = list(doc.ents)
    return doc


def test_keep_exact_names_holds_exact_dictionary_names_to_the_recognizers_threshold():
    nlp = spacy.blank("en")
    links = {
        "pleural effusions": ("D010996", [("D010996", 1.0), ("D011030", 0.8)], 0.81),  # an exact name: kept
        "RA": ("D001172", [("D001172", 1.0)], 0.83),  # a short all-capitals token ("room air"): dropped
        "HYPOTHYROIDISM": ("D007037", [("D007037", 1.0)], 0.81),  # all capitals but long: kept
        "fatty changes": ("D005234", [("D005234", 0.93)], 0.81),  # not an exact name: dropped
        "gouty": ("D006073", [("D006073", 1.0)], 0.40),  # exact, but under min_confidence: dropped
    }
    text = "No pleural effusions on RA. HYPOTHYROIDISM. Mild fatty changes. gouty."
    doc = _linked(nlp, text, links)
    kept = LinkFilter(min_confidence=0.5, min_confidence_dictionary=0.9, keep_exact_names=True)(doc.copy())
    assert [e.text for e in kept.ents] == ["pleural effusions", "HYPOTHYROIDISM"]
    assert LinkFilter(min_confidence=0.5, min_confidence_dictionary=0.9)(doc.copy()).ents == ()


def test_keep_exact_names_is_saved_and_old_settings_still_load(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("link_filter", config={"keep_exact_names": True})
    nlp.to_disk(tmp_path / "p")
    assert spacy.load(tmp_path / "p").get_pipe("link_filter").keep_exact_names is True
    old = {"min_confidence": 0.5, "drop_nil": False, "min_confidence_dictionary": 0.9, "spans_key": "dictionary"}
    assert LinkFilter().from_bytes(json.dumps(old).encode()).keep_exact_names is False
    with pytest.raises(ConceptNormError, match="E412"):
        LinkFilter().from_bytes(json.dumps({**old, "other": 1}).encode())


def test_clinical_settings_on_a_config_and_on_a_loaded_pipeline(tmp_path):
    components = {
        "ner": {"source": "x"},
        "dictionary_matcher": {"factory": "dictionary_matcher"},
        "filter": {"factory": "link_filter"},
    }
    assert clinical_overrides(components) == {
        "components.dictionary_matcher.merge": "names",
        "components.filter.keep_exact_names": True,
    }
    nlp = spacy.blank("en")
    nlp.add_pipe("dictionary_matcher")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("link_filter", name="filter")
    assert use_clinical_settings(nlp) == ["clinical_abbreviations", "clinical_findings", "dictionary_matcher", "filter"]
    assert nlp.pipe_names == ["dictionary_matcher", "abbreviation_resolver", "clinical_abbreviations", "filter",
                              "clinical_findings"]  # fmt: skip
    assert nlp.get_pipe("dictionary_matcher").cfg["merge"] == "names"
    assert nlp.config["components"]["filter"]["keep_exact_names"] is True
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")  # each component reads its settings back
    assert loaded.get_pipe("dictionary_matcher").cfg["merge"] == "names"
    assert loaded.get_pipe("filter").keep_exact_names is True
    assert set(CLINICAL_SETTINGS) == {"dictionary_matcher", "concept_normalizer", "link_filter"}


def test_assemble_clinical_turns_the_settings_on(tmp_path):
    config = tmp_path / "pipeline.cfg"
    config.write_text('[nlp]\nlang = "en"\npipeline = ["link_filter"]\n\n[components]\n\n[components.link_filter]\n'
                      'factory = "link_filter"\n')  # fmt: skip
    for flags, expected in (([], False), (["--clinical"], True)):
        result = CliRunner().invoke(app, ["assemble", str(config), str(tmp_path / "out"), *flags])
        assert result.exit_code == 0, result.output
        nlp = spacy.load(tmp_path / "out")
        assert ("clinical_abbreviations" in nlp.pipe_names) is expected
        assert ("clinical_findings" in nlp.pipe_names) is expected
        assert nlp.get_pipe("link_filter").keep_exact_names is expected
        assert nlp.config["components"]["link_filter"]["keep_exact_names"] is expected


def test_clinical_command_saves_a_copy_for_clinical_notes(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("dictionary_matcher")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("link_filter")
    nlp.to_disk(tmp_path / "pipeline")
    result = CliRunner().invoke(app, ["clinical", str(tmp_path / "pipeline"), str(tmp_path / "clinical")])
    assert result.exit_code == 0, result.output
    clinical = spacy.load(tmp_path / "clinical")
    expected = ["dictionary_matcher", "abbreviation_resolver", "clinical_abbreviations", "link_filter"]
    assert clinical.pipe_names == [*expected, "clinical_findings"] + ["clinical_context"] * medspacy_available()
    assert clinical.get_pipe("dictionary_matcher").cfg["merge"] == "names"
    assert clinical.get_pipe("link_filter").keep_exact_names is True
    assert spacy.load(tmp_path / "pipeline").pipe_names == expected[:2] + ["link_filter"]  # the original as it was
    result = CliRunner().invoke(app, ["clinical", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert result.exit_code == 1 and "missing" in result.output and not (tmp_path / "out").exists()


@spacy.Language.component("test_recall_link")
def _link(doc):
    """A stand-in linker: "gout" linked to D2, every other entity to D1."""
    doc.ents = [Span(doc, e.start, e.end, e.label_, kb_id="D2" if e.text == "gout" else "D1") for e in doc.ents]
    return doc


def test_id_field_and_linked_right_over_every_overlapping_entity(tmp_path):
    """Three spans: "gout arthritis" (D2) overlaps two entities, "arthritis" (D1) the most, and "gout" (D2) links
    it right; "HTN", found by the clinical list, is linked to D1, not its D9; "fever" is missed."""
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in ("gout", "arthritis")])
    nlp.add_pipe("clinical_abbreviations")
    nlp.add_pipe("test_recall_link")
    text = "He has gout arthritis and HTN, no fever."
    records = [
        {"text": text, "start": 7, "end": 21, "status": "affirmed", "id": "D2"},
        {"text": text, "start": 26, "end": 29, "status": "affirmed", "concept_id": "D9", "id": "D9"},
        {"text": text, "start": 34, "end": 39, "status": "negated", "id": "D5"},
    ]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    spans = read_annotated_spans(path)
    assert [s.concept_id for s in spans] == ["D2", "D9", "D5"]
    pytest.importorskip("medspacy")
    recognition = evaluate_assertions(nlp, spans)["recognition"]
    assert recognition == {"recognized": 2, "exact": 1, "linked": 2, "with_concept_id": 3,
                           "recognized_with_concept_id": 2, "linked_right": 1}  # fmt: skip


def test_concept_id_and_id_must_agree(tmp_path):
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"text": "No fever.", "start": 3, "end": 8, "status": "negated", "concept_id": "D1",
                                "id": "D2"}) + "\n")  # fmt: skip
    with pytest.raises(ConceptNormError, match=r"E622.*:1: .*'D1' and id 'D2' differ"):
        read_annotated_spans(path)


def _recognizer(path, listener=True):
    """A pipeline whose `ner` (label Disease) listens to a `tok2vec` component, initialized on one doc."""
    from spacy.training import Example

    nlp = spacy.blank("en")
    config = {}
    if listener:
        nlp.add_pipe("tok2vec")
        config = {"model": {"@architectures": "spacy.TransitionBasedParser.v2", "state_type": "ner",
                            "extra_state_tokens": False, "hidden_width": 8, "maxout_pieces": 2, "use_upper": True,
                            "tok2vec": {"@architectures": "spacy.Tok2VecListener.v1", "width": 96,
                                        "upstream": "*"}}}  # fmt: skip
    nlp.add_pipe("ner", config=config)
    doc = nlp.make_doc("No wheezes or rales.")
    doc.ents = [doc.char_span(3, 10, label="Disease")]
    nlp.initialize(lambda: [Example(nlp.make_doc(doc.text), doc)])
    nlp.to_disk(path)


def test_clinical_command_takes_a_recognizer_trained_on_notes(tmp_path):
    from spacy.pipeline.tok2vec import Tok2VecListener

    _recognizer(tmp_path / "ner_clinical")
    nlp = spacy.blank("en")
    nlp.add_pipe("ner")
    nlp.add_pipe("dictionary_matcher")
    nlp.add_pipe("link_filter", config={"min_confidence": 0.5})
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    args = ["clinical", str(tmp_path / "pipeline"), str(tmp_path / "clinical"), "--ner", str(tmp_path / "ner_clinical")]
    result = CliRunner().invoke(app, [*args, "--min-confidence", "0.25"])
    assert result.exit_code == 0, result.output
    clinical = spacy.load(tmp_path / "clinical")
    assert clinical.pipe_names[:3] == ["ner", "dictionary_matcher", "link_filter"]
    assert "tok2vec" not in clinical.pipe_names  # the recognizer carries its own copy
    assert not any(isinstance(layer, Tok2VecListener) for layer in clinical.get_pipe("ner").model.walk())
    assert clinical.get_pipe("ner").labels == ("Disease",)
    assert clinical.get_pipe("link_filter").min_confidence == 0.25
    assert clinical.config["components"]["link_filter"]["min_confidence"] == 0.25
    clinical("No wheezes.")
    assert spacy.load(tmp_path / "pipeline").get_pipe("link_filter").min_confidence == 0.5  # the original as it was


def test_clinical_command_refuses_a_recognizer_pipeline_without_ner_and_a_threshold_out_of_range(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("link_filter")
    nlp.to_disk(tmp_path / "no_ner")
    args = ["clinical", str(tmp_path / "no_ner"), str(tmp_path / "out"), "--ner", str(tmp_path / "no_ner")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "E627" in result.output and "no component named 'ner'" in result.output
    assert not (tmp_path / "out").exists()
    _recognizer(tmp_path / "ner", listener=False)  # a ner with its own tok2vec: nothing to replace
    args = ["clinical", str(tmp_path / "ner"), str(tmp_path / "out"), "--ner", str(tmp_path / "ner")]
    result = CliRunner().invoke(app, [*args, "--min-confidence", "1.5"])
    assert result.exit_code == 1 and "E410" in result.output and "min_confidence" in result.output
    assert CliRunner().invoke(app, args).exit_code == 0 and spacy.load(tmp_path / "out").pipe_names[0] == "ner"
