"""The concept_normalizer as a spaCy component: serialization, settings, errors, scoring and the attribute contract
shared with scispacy. Built with the trigram test encoder, so each test takes well under a second."""

import inspect
import re
from pathlib import Path

import pytest
import spacy
import srsly
from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.training import Example

from spacy_conceptnorm.errors import ConceptNormError, Errors, Warnings
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.pipeline.abbreviation_resolver import AbbreviationResolver, make_abbreviation_resolver
from spacy_conceptnorm.pipeline.composite_splitter import CompositeSplitter, make_composite_splitter
from spacy_conceptnorm.pipeline.concept_normalizer import ConceptNormalizer, make_concept_normalizer
from spacy_conceptnorm.text.abbreviations import find_abbreviations
from spacy_conceptnorm.text.normalize import TextNormalizer

from .fake_encoder import TrigramEncoder
from .test_component import blank_copy, doc_with_ents

ENCODER = {"@misc": "test_contract.trigram_encoder.v1"}
PACKAGE = Path(__file__).parent.parent / "spacy_conceptnorm"


@spacy.registry.misc("test_contract.trigram_encoder.v1")
def trigram_encoder() -> TrigramEncoder:
    return TrigramEncoder()


@Language.component("test_contract_scispacy_abbreviations")
def scispacy_abbreviations(doc: Doc) -> Doc:
    """A stand-in for scispacy's AbbreviationDetector (for where scispacy is not installed), with its attribute
    contract: each occurrence of a defined short form is a Span whose `_.long_form` is the long form's Span."""
    Span.set_extension("long_form", default=None, force=True)
    for abbreviation in find_abbreviations(doc.text):
        long = doc.char_span(abbreviation.long_start, abbreviation.long_end)
        for match in re.finditer(rf"\b{re.escape(abbreviation.short)}\b", doc.text):
            short = doc.char_span(match.start(), match.end())
            if long is not None and short is not None:
                short._.long_form = long
    return doc


def new_pipeline(**config) -> Language:
    nlp = spacy.blank("en")
    nlp.add_pipe("concept_normalizer", config={"encoder": ENCODER, **config})
    return nlp


@pytest.fixture(scope="module")
def nlp(fixtures, train_docs) -> Language:
    nlp = new_pipeline()
    nlp.get_pipe("concept_normalizer").initialize(
        lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=load_kb(fixtures / "medic_sample.txt")
    )
    return nlp


def links(nlp: Language, docs: list[Doc]) -> list[tuple]:
    return [(e.kb_id_, e._.kb_ents, e._.kb_stage) for d in nlp.pipe([blank_copy(x) for x in docs]) for e in d.ents]


def test_to_bytes_and_from_bytes_restore_identical_links_with_the_disk_checks(nlp, test_docs):
    normalizer = nlp.get_pipe("concept_normalizer")
    doc = doc_with_ents(nlp, "A patient with zzq syndrome.", [("zzq syndrome", "Disease")])
    normalizer.add_synonyms([("zzq syndrome", "D001943")])
    try:
        data = nlp.to_bytes()
        component_data = normalizer.to_bytes()
    finally:
        normalizer.remove_synonyms([("zzq syndrome", "D001943")])
    restored = new_pipeline().from_bytes(data)
    restored_normalizer = restored.get_pipe("concept_normalizer")
    assert restored_normalizer.encoder.calls == []  # vectors and indexes came with the bytes: nothing re-encoded
    assert restored(blank_copy(doc)).ents[0].kb_id_ == "D001943"  # the KB with its added synonym
    restored_normalizer.remove_synonyms([("zzq syndrome", "D001943")])
    assert links(restored, test_docs) == links(nlp, test_docs)
    assert restored_normalizer.linker.confidence.to_dict() == normalizer.linker.confidence.to_dict()

    files = srsly.msgpack_loads(component_data)  # the files to_disk writes, by relative path
    assert {"cfg", "kb", "searcher/vectors.npy", "linker/models.json", "checksums.json"} <= set(files)
    vectors = files["searcher/vectors.npy"]
    broken = srsly.msgpack_dumps({**files, "searcher/vectors.npy": vectors[:-1] + bytes([vectors[-1] ^ 1])})
    with pytest.raises(ConceptNormError, match=r"<bytes>/searcher/vectors.npy is truncated or corrupt: its checksum"):
        new_pipeline().get_pipe("concept_normalizer").from_bytes(broken)
    broken = srsly.msgpack_dumps({**files, "kb": files["kb"][:100]})
    with pytest.raises(ConceptNormError, match="truncated or corrupt"):
        new_pipeline().get_pipe("concept_normalizer").from_bytes(broken)
    with pytest.raises(ConceptNormError, match="truncated or corrupt"):
        new_pipeline().get_pipe("concept_normalizer").from_bytes(component_data[:-10])
    with pytest.raises(ConceptNormError, match="not a concept_normalizer"):
        new_pipeline().get_pipe("concept_normalizer").from_bytes(srsly.msgpack_dumps({"names": []}))


def test_from_disk_honours_exclude_and_keeps_the_encoder_given_by_config(nlp, test_docs, tmp_path):
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    assert isinstance(loaded.get_pipe("concept_normalizer").encoder, TrigramEncoder)  # not rebuilt as NameEncoder
    assert links(loaded, test_docs) == links(nlp, test_docs)

    other = new_pipeline(top_k=2).get_pipe("concept_normalizer")
    other.from_disk(tmp_path / "pipeline" / "concept_normalizer", exclude=["cfg"])
    assert other.cfg["top_k"] == 2 and other.searcher.top_k == 2  # the saved cfg (top_k 5) was not read
    assert len(other.kb) == len(nlp.get_pipe("concept_normalizer").kb)


@pytest.mark.parametrize(
    "config",
    [
        {"threshold": 1.5},
        {"nil_threshold": -0.1},
        {"top_k": 0},
        {"batch_size": 0},
        {"long_form": "short"},
        {"index": {"index_type": "hnsw", "nlist": 4}},
        {"index": {"index_type": "annoy"}},
        {"index": {"index_type": "hnsw", "hnsw_m": 0}},
    ],
)
def test_settings_are_checked_when_the_component_is_built(config, train_docs):
    with pytest.raises(ConceptNormError, match=r"^\[E\d{3}\] "):
        new_pipeline(**config)


def test_unicode_form_and_initialize_examples_are_checked(kb):
    with pytest.raises(ConceptNormError, match=r"\[E009\] unicode_form"):
        TextNormalizer(unicode_form="NFX")
    normalizer = new_pipeline().get_pipe("concept_normalizer")
    with pytest.raises(TypeError, match=r"\[E978\]"):  # spaCy's validate_get_examples: docs, not Examples
        normalizer.initialize(lambda: [spacy.blank("en")("text")], kb=kb)


def test_errors_and_warnings_carry_their_codes():
    assert Errors.E301.startswith("[E301] ") and Warnings.W001.startswith("[W001] ")
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r"\b(?:Errors|Warnings)\.([EW]\d{3})\b", path.read_text(encoding="utf8")))
    assert len(used) > 40
    for code in used:  # every call site names a code that exists, and reads with it in front
        message = getattr(Errors if code[0] == "E" else Warnings, code)
        assert message.startswith(f"[{code}] ")


def test_score_reports_spacys_nel_keys(nlp, test_docs):
    gold = doc_with_ents(nlp, "Breast cancer, ovarian cancer and diabetes.", [])
    gold.ents = [
        Span(gold, 0, 2, label="Disease", kb_id="D001943"),
        Span(gold, 3, 5, label="Disease", kb_id="D001943"),
        Span(gold, 6, 7, label="Disease", kb_id="D003920"),
    ]
    predicted = blank_copy(gold)
    predicted.ents = [
        Span(predicted, 0, 2, label="Disease", kb_id="D001943"),  # right
        Span(predicted, 3, 5, label="Disease", kb_id="D010051"),  # wrong: a false positive and a false negative
        Span(predicted, 6, 7, label="Disease", kb_id="NIL"),  # missed: a false negative
    ]
    scores = nlp.get_pipe("concept_normalizer").score([Example(predicted, gold)])
    assert scores["nel_micro_p"] == pytest.approx(1 / 2)
    assert scores["nel_micro_r"] == pytest.approx(1 / 3)
    assert scores["nel_micro_f"] == pytest.approx(0.4)
    assert scores["kb_acc"] == pytest.approx(1 / 3)  # the package's own keys are still there
    evaluated = nlp.evaluate([Example(blank_copy(d), d) for d in test_docs])
    assert {"kb_acc", "nel_micro_p", "nel_micro_r", "nel_micro_f"} <= set(evaluated)


def test_long_form_may_be_a_span_as_scispacy_sets_it(nlp):
    pipeline = spacy.blank("en")
    pipeline.add_pipe("test_contract_scispacy_abbreviations")
    pipeline.add_pipe("concept_normalizer", source=nlp)
    text = "Cancer of the ovary (COV) was studied in 40 women. Women with COV and their relatives were genotyped."
    start = text.rindex("COV")
    doc = pipeline.make_doc(text)
    doc.ents = [doc.char_span(start, start + 3, label="Disease")]
    ent = pipeline(doc).ents[0]
    assert isinstance(ent._.long_form, Span) and ent._.long_form.text == "Cancer of the ovary"
    assert ent.kb_id_ == "D010051" and ent._.kb_parts[0]["text"] == "Cancer of the ovary"


def test_scispacys_own_abbreviation_detector_before_the_linker(nlp):
    pytest.importorskip("scispacy.abbreviation", reason="scispacy not installed (.ci/run installs it --no-deps)")
    pipeline = spacy.blank("en")
    pipeline.add_pipe("abbreviation_detector")  # scispacy's
    pipeline.add_pipe("concept_normalizer", source=nlp)
    text = "Cancer of the ovary (COV) was studied in 40 women. Women with COV and their relatives were genotyped."
    start = text.rindex("COV")
    doc = pipeline.make_doc(text)
    doc.ents = [doc.char_span(start, start + 3, label="Disease")]
    doc = pipeline(doc)
    assert [a._.long_form.text for a in doc._.abbreviations] == ["Cancer of the ovary"] * 2
    ent = doc.ents[0]
    assert ent.kb_id_ == "D010051" and ent._.kb_parts[0]["text"] == "Cancer of the ovary"
    assert all(isinstance(c, str) and isinstance(s, float) for c, s in ent._.kb_ents)


def test_the_three_components_take_the_same_first_arguments():
    for cls in (ConceptNormalizer, AbbreviationResolver, CompositeSplitter):
        assert list(inspect.signature(cls).parameters)[:2] == ["vocab", "name"], cls
    for factory in (make_concept_normalizer, make_abbreviation_resolver, make_composite_splitter):
        assert list(inspect.signature(factory).parameters)[:2] == ["nlp", "name"], factory
    vocab = spacy.blank("en").vocab
    assert ConceptNormalizer(vocab, "linker", encoder=TrigramEncoder()).name == "linker"
    assert AbbreviationResolver(vocab, "abbreviations").vocab is vocab


class _Unreadable(set):
    """Labels whose lookup fails: an error of the component outside any one entity's split."""

    def __contains__(self, item):
        return 1 / 0


def test_pipe_errors_go_to_the_error_handler():
    seen = []

    def handler(name, component, docs, error):
        seen.append((name, type(error).__name__))

    for name in ("abbreviation_resolver", "composite_splitter"):  # concept_normalizer's: in test_ranking.py
        nlp = spacy.blank("en")
        nlp.add_pipe(name)
        component = nlp.get_pipe(name)
        if name == "abbreviation_resolver":
            component.detector = "missing"  # a KeyError on the first doc
        if name == "composite_splitter":  # (a failing split of one entity is a warning: that entity is linked whole)
            component._labels = _Unreadable({"Disease"})
        nlp.set_error_handler(handler)
        doc = doc_with_ents(nlp, "Breast cancer.", [("Breast cancer", "Disease")])
        assert list(nlp.pipe([doc])) == []  # handled and dropped, not raised
    assert seen == [("abbreviation_resolver", "KeyError"), ("composite_splitter", "ZeroDivisionError")]


def test_span_id_survives_linking_and_kb_ents_keeps_scisapcys_shape(nlp):
    doc = doc_with_ents(nlp, "Germline mutations predispose to breast and ovarian cancer.", [])
    doc.ents = [Span(doc, 4, 8, label="Disease", span_id="mention-1")]
    ent = nlp(doc).ents[0]
    assert ent.id_ == "mention-1" and ent.label_ == "Disease" and ent.kb_id_

    pipeline = spacy.blank("en")
    pipeline.add_pipe("composite_splitter")
    pipeline.add_pipe("concept_normalizer", source=nlp)
    ent = pipeline(blank_copy(doc)).ents[0]
    assert ent.kb_id_ == "D001943|D010051"
    assert all(isinstance(cid, str) and isinstance(score, float) for cid, score in ent._.kb_ents)
    assert {"D001943", "D010051"} <= {cid for cid, _ in ent._.kb_ents}
    assert [part["candidates"][0][0] for part in ent._.kb_parts] == ["D001943", "D010051"]
