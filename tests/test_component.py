"""The concept_normalizer with the real default encoder (all-MiniLM-L6-v2) over a MEDIC sample."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc, DocBin, Span
from spacy.training import Example

from spacy_conceptnorm.corpus import mention_spans
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.scoring import accuracy_at, predicted_parts

from .fake_encoder import TrigramEncoder


def blank_copy(doc: Doc) -> Doc:
    copy = Doc(doc.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])
    copy.ents = [copy.char_span(e.start_char, e.end_char, label=e.label_) for e in doc.ents]
    return copy


def doc_with_ents(nlp, text: str, spans: list[tuple[str, str]]) -> Doc:
    doc = nlp.make_doc(text)
    ents = []
    for mention, label in spans:
        start = text.index(mention)
        ents.append(doc.char_span(start, start + len(mention), label=label))
    doc.ents = ents
    return doc


def predictions(nlp, docs):
    return [(e.kb_id_, e._.kb_ents, e._.kb_stage) for d in nlp.pipe([blank_copy(x) for x in docs]) for e in d.ents]


def test_factory_is_registered_by_entry_point_and_config_validates():
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer", config={"strategy": "OD-C", "top_k": 3})
    assert normalizer.cfg["strategy"] == "OD-C"
    with pytest.raises(ConceptNormError, match="Invalid search strategy"):
        spacy.blank("en").add_pipe("concept_normalizer", config={"strategy": "ontology"})
    with pytest.raises(ConceptNormError, match="no knowledge base"):
        normalizer(nlp("text"))


def test_links_gold_mentions_of_held_out_abstracts(linker_nlp, test_docs):
    docs = list(linker_nlp.pipe([blank_copy(d) for d in test_docs]))
    kb = linker_nlp.get_pipe("concept_normalizer").kb
    pairs = [
        (g.kb_id_, predicted_parts(p)) for g, p in zip(mention_spans(test_docs), (e for d in docs for e in d.ents))
    ]
    assert len(pairs) == sum(len(d.ents) for d in test_docs) > 40
    # the untrained encoder with train mentions as domain synonyms gets most of these right
    assert accuracy_at(kb, pairs, 1) > 0.7
    assert accuracy_at(kb, pairs, 5) >= accuracy_at(kb, pairs, 1)
    ent = docs[0].ents[0]
    assert isinstance(ent._.kb_ents, list) and 1 <= len(ent._.kb_ents) <= 5
    assert ent._.kb_ents[0][0] == ent.kb_id_ and ent._.kb_ents[0][1] >= ent._.kb_ents[-1][1]
    assert ent._.kb_stage in ("D-T", "OD-T") and ent._.kb_name


def test_add_and_remove_synonyms_change_results_at_once(linker_nlp):
    normalizer = linker_nlp.get_pipe("concept_normalizer")
    doc = doc_with_ents(linker_nlp, "A patient with zzq syndrome.", [("zzq syndrome", "Disease")])
    assert normalizer(doc).ents[0].kb_id_ != "D001943"
    try:  # the pipeline is shared by the session: the synonym goes whatever happens
        assert normalizer.add_synonyms([("zzq syndrome", "OMIM:114480"), ("x", "NOT-AN-ID")]) == ["NOT-AN-ID"]
        ent = normalizer(blank_copy(doc)).ents[0]
        assert ent.kb_id_ == "D001943" and ent._.kb_stage == "D-T" and ent._.kb_name == "zzq syndrome"
    finally:
        normalizer.remove_synonyms([("zzq syndrome", "D001943")])
    assert normalizer(blank_copy(doc)).ents[0].kb_id_ != "D001943"


def test_nil_threshold_labels_and_odd_entities(linker_nlp):
    normalizer = linker_nlp.get_pipe("concept_normalizer")
    text = "Breast cancer , " + "x" * 5000 + " and ...."
    doc = linker_nlp.make_doc(text)
    doc.ents = [
        Span(doc, 0, 2, label="Disease"),
        Span(doc, 3, 4, label="Disease"),  # 5,000 characters
        Span(doc, 5, 6, label="Disease"),  # punctuation only: nothing to search
        Span(doc, 4, 5, label="Chemical"),
    ]
    old = dict(normalizer.cfg)
    try:
        normalizer.cfg["labels"] = ["Disease"]
        ents = normalizer(doc).ents
        assert ents[0].kb_id_ == "D001943"
        assert ents[1].kb_id_ and ents[1]._.kb_ents  # linked to something, or NIL, without crashing
        assert ents[2].label_ == "Chemical" and ents[2].kb_id_ == "" and ents[2]._.kb_ents is None  # not linked
        assert ents[3].kb_id_ == "NIL" and ents[3]._.kb_ents == []
        normalizer.cfg["nil_threshold"] = 1.01
        assert [e.kb_id_ for e in normalizer(blank_copy(doc)).ents] == ["NIL", "NIL", "", "NIL"]
    finally:
        normalizer.cfg.update(old)
    assert normalizer(linker_nlp.make_doc("")).ents == ()
    assert normalizer(linker_nlp("No entities here.")).ents == ()


def test_results_survive_docbin_and_multiprocessing(linker_nlp, test_docs):
    docs = list(linker_nlp.pipe([blank_copy(d) for d in test_docs]))
    restored = list(DocBin(docs=docs, store_user_data=True).get_docs(linker_nlp.vocab))
    assert [(e.kb_id_, e._.kb_stage) for d in restored for e in d.ents] == [
        (e.kb_id_, e._.kb_stage) for d in docs for e in d.ents
    ]
    assert [e._.kb_ents[0][0] for d in restored for e in d.ents] == [e.kb_id_ for d in docs for e in d.ents]
    # forked workers (this used to hang in OpenMP after the parent had encoded the KB)
    forked = list(linker_nlp.pipe([blank_copy(d) for d in test_docs], n_process=2, batch_size=2))
    assert [(e.kb_id_, e._.kb_name) for d in forked for e in d.ents] == [
        (e.kb_id_, e._.kb_name) for d in docs for e in d.ents
    ]


def test_factory_is_found_through_the_entry_point_without_importing_the_package():
    code = (
        "import spacy, sys; nlp = spacy.blank('en'); pipe = nlp.add_pipe('concept_normalizer'); "
        "print(type(pipe).__module__, 'spacy_conceptnorm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["spacy_conceptnorm.component", "True"]


def test_save_and_load_gives_identical_predictions_without_reencoding(linker_nlp, test_docs, tmp_path, monkeypatch):
    before = predictions(linker_nlp, test_docs)
    linker_nlp.to_disk(tmp_path / "pipeline")
    from spacy_conceptnorm import encoder as encoder_module

    encoded = []
    real = encoder_module.NameEncoder.encode
    monkeypatch.setattr(
        encoder_module.NameEncoder, "encode", lambda self, t, **k: encoded.append(len(t)) or real(self, t, **k)
    )
    loaded = spacy.load(tmp_path / "pipeline")
    assert predictions(loaded, test_docs) == before
    n_mentions = sum(len(d.ents) for d in test_docs)
    assert sum(encoded) <= n_mentions  # only unseen mention strings were encoded, never the KB
    kb_names = len(loaded.get_pipe("concept_normalizer").kb.names())
    assert kb_names > n_mentions


def test_corrupt_saved_pipeline_gives_clear_errors(linker_nlp, tmp_path):
    path = tmp_path / "pipeline"
    linker_nlp.to_disk(path)
    kb_file = path / "concept_normalizer" / "kb"
    data = kb_file.read_bytes()
    kb_file.write_bytes(data[: len(data) // 3])
    with pytest.raises(ConceptNormError, match="truncated or corrupt"):
        spacy.load(path)
    kb_file.write_bytes(data)
    vectors = path / "concept_normalizer" / "searcher" / "vectors.npy"
    arr = np.load(vectors)
    arr[0] += 1
    np.save(vectors, arr)
    with pytest.raises(ConceptNormError, match="checksum"):
        spacy.load(path)
    shutil.rmtree(path / "concept_normalizer" / "searcher")
    with pytest.raises(ConceptNormError, match="not found"):
        spacy.load(path)


def test_trained_encoder_directory_travels_with_the_pipeline(linker_nlp, tmp_path):
    encoder_dir = tmp_path / "my-encoder"
    linker_nlp.get_pipe("concept_normalizer").encoder.save(encoder_dir)
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": {"model": str(encoder_dir)}})
    normalizer.initialize(kb=linker_nlp.get_pipe("concept_normalizer").kb, nlp=nlp)
    nlp.to_disk(tmp_path / "pipeline")
    shutil.rmtree(encoder_dir)  # the saved pipeline must not depend on the original directory
    loaded = spacy.load(tmp_path / "pipeline")
    doc = doc_with_ents(loaded, "Familial breast cancer.", [("breast cancer", "Disease")])
    assert loaded(doc).ents[0].kb_id_ == "D001943"


def test_nlp_evaluate_reports_linking_accuracy(linker_nlp, test_docs):
    examples = [Example(blank_copy(d), d) for d in test_docs]
    scores = linker_nlp.evaluate(examples)
    assert 0.7 < scores["kb_acc"] <= scores["kb_acc5"] <= 1.0
    assert scores["kb_found"] == 1.0


def test_strategy_and_index_types_are_configurable(train_docs, test_docs, kb):
    results = {}
    for index_type in ("exact", "flat", "hnsw"):
        nlp = spacy.blank("en")
        normalizer = nlp.add_pipe("concept_normalizer", config={"index": {"index_type": index_type}})
        normalizer.encoder = TrigramEncoder()
        normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
        normalizer.set_strategy("OD-T")
        results[index_type] = [e.kb_id_ for d in nlp.pipe([blank_copy(x) for x in test_docs]) for e in d.ents]
    assert results["exact"] == results["flat"]  # both exact: torch and FAISS agree
    agree = np.mean([a == b for a, b in zip(results["exact"], results["hnsw"])])
    assert agree > 0.95  # HNSW is approximate but near-exact on a KB this small


@pytest.mark.slow
def test_spacy_assemble_builds_a_pipeline_from_the_config(fixtures, tmp_path):
    from pathlib import Path

    from spacy.cli.assemble import assemble_cli  # noqa: F401  (the CLI is what users run; its core is below)
    from spacy.util import load_config, load_model_from_config

    config = load_config(
        Path(__file__).parent.parent / "configs" / "linker.cfg",
        overrides={
            "paths.kb": str(fixtures / "medic_sample.txt"),
            "paths.synonyms": str(fixtures / "ncbi_train_sample.txt"),
        },
        interpolate=False,
    )
    nlp = load_model_from_config(config, auto_fill=True)
    nlp.initialize()
    normalizer = nlp.get_pipe("concept_normalizer")
    assert len(normalizer.kb.names("domain")) > 20  # train mentions became domain synonyms
    nlp.to_disk(tmp_path / "linker")
    loaded = spacy.load(tmp_path / "linker")
    doc = doc_with_ents(loaded, "Familial breast cancer.", [("breast cancer", "Disease")])
    assert loaded(doc).ents[0].kb_id_ == "D001943"
