"""The concept_normalizer with the real default encoder (all-MiniLM-L6-v2) over a MEDIC sample."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc, DocBin, Span
from spacy.training import Example

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.io.corpus import mention_spans
from spacy_conceptnorm.linking.scoring import accuracy_at, predicted_parts

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
        # the 5,000 characters are searched as their first 1,000: the same answer as a mention of 1,000 x's
        cut = linker_nlp.make_doc("x" * 1000)
        cut.ents = [Span(cut, 0, 1, label="Disease")]
        cut_ent = normalizer(cut).ents[0]
        assert ents[1]._.kb_parts[0]["text"] == "x" * 1000
        assert (ents[1].kb_id_, ents[1]._.kb_ents) == (cut_ent.kb_id_, cut_ent._.kb_ents) and cut_ent._.kb_ents
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
    # forked workers after the parent has encoded the KB (OpenMP's thread pool must not hang them)
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
    assert out.stdout.split() == ["spacy_conceptnorm.pipeline.concept_normalizer", "True"]


def test_save_and_load_gives_identical_predictions_without_reencoding(linker_nlp, test_docs, tmp_path, monkeypatch):
    before = predictions(linker_nlp, test_docs)
    linker_nlp.to_disk(tmp_path / "pipeline")
    from spacy_conceptnorm.ml import name_encoder as encoder_module

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
def test_assemble_builds_the_linker_pipeline_from_its_config(fixtures, tmp_path):
    from typer.testing import CliRunner

    from spacy_conceptnorm.cli import app

    output = tmp_path / "out" / "linker"
    args = ["assemble", str(Path(__file__).parent.parent / "configs" / "linker.cfg"), str(output)]
    args += ["--paths.kb", str(fixtures / "medic_sample.txt")]
    args += ["--paths.synonyms", str(fixtures / "ncbi_train_sample.txt")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [p.name for p in output.parent.iterdir()] == ["linker"]  # swapped in, nothing left beside it
    loaded = spacy.load(output)
    normalizer = loaded.get_pipe("concept_normalizer")
    assert len(normalizer.kb.names("domain")) > 20  # train mentions became domain synonyms
    assert not (output / "concept_normalizer" / "linker" / "lexical.msgpack").exists()  # the ranker is untrained
    doc = doc_with_ents(loaded, "Familial breast cancer.", [("breast cancer", "Disease")])
    assert loaded(doc).ents[0].kb_id_ == "D001943"


# --- the linker's answer cache and its lexical index ------------------------------------------------------------
def hand_ranked(train_docs, kb, coef, **ranker):
    """A trigram-encoder pipeline whose ranker ("hybrid_prior": dense, tfidf, count_prior columns) has weights set
    by hand: unit scales, zero means, so a candidate's score is coef @ its columns."""
    nlp = spacy.blank("en")
    config = {"ranker": {"@misc": "spacy_conceptnorm.ranker.v1", "fast_path": False, **ranker}}
    normalizer = nlp.add_pipe("concept_normalizer", config=config)
    normalizer.encoder = TrigramEncoder()
    normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
    normalizer.ranker.weights = {"mean": np.zeros(3), "scale": np.ones(3), "coef": np.array(coef, dtype=float)}
    return nlp, normalizer


def test_the_cache_sees_weights_and_counts_changed_in_place(train_docs, kb):
    nlp, normalizer = hand_ranked(train_docs, kb, [1.0, 0.0, 0.0])  # by the dense cosine alone
    linker, mention = normalizer.linker, "colorectal tumours"
    (candidates,) = linker.candidate_sets([kb.normalizer(mention)])
    dense = dict(zip(candidates.concept_ids, candidates.features[:, 0]))
    assert len(set(dense.values())) == len(dense) > 2  # no ties: one first and one last
    first, last = max(dense, key=dense.get), min(dense, key=dense.get)
    assert linker.link([mention])[0].candidates[0][0] == first
    normalizer.ranker.weights["coef"][0] = -1.0  # in place: the least similar candidate now wins
    assert linker.link([mention])[0].candidates[0][0] == last
    normalizer.ranker.weights["coef"][:] = [0.0, 0.0, 1.0]  # by the annotation counts alone: all 0, a tie
    normalizer.ranker.counts.clear()
    tied = linker.link([mention])[0].candidates[0][0]
    assert tied == candidates.concept_ids[0]  # a tie keeps the candidates' order
    normalizer.ranker.counts[last] = 50  # in place
    assert linker.link([mention])[0].candidates[0][0] == last
    assert linker.cache_hits == 0  # every change above was seen


def test_the_lexical_index_is_saved_and_loaded_only_when_the_ranker_reorders(train_docs, test_docs, kb, tmp_path):
    nlp, normalizer = hand_ranked(train_docs, kb, [1.0, 0.5, 0.2])
    assert normalizer.linker.generator is None  # initialize builds no lexical index for an untrained ranker
    links = {}
    for reorder in (False, True):
        normalizer.ranker.reorder = reorder
        normalizer.linker.candidate_generator()  # as train-ranker builds it
        before = [(e.kb_id_, e._.kb_ents) for d in nlp.pipe([blank_copy(x) for x in test_docs]) for e in d.ents]
        nlp.to_disk(tmp_path / str(reorder))
        assert (tmp_path / str(reorder) / "concept_normalizer" / "linker" / "lexical.msgpack").exists() is reorder
        loaded = spacy.load(tmp_path / str(reorder))
        loaded_normalizer = loaded.get_pipe("concept_normalizer")
        loaded_normalizer.searcher.encoder = TrigramEncoder()  # saved by reference only
        assert (loaded_normalizer.linker.generator is not None) is reorder
        after = [(e.kb_id_, e._.kb_ents) for d in loaded.pipe([blank_copy(x) for x in test_docs]) for e in d.ents]
        assert after == before and len(before) > 40
        loaded_normalizer.add_synonyms([("zzq syndrome", "D001943")])
        assert (loaded_normalizer.linker.generator is not None) is reorder  # nothing built to keep in step
        links[reorder] = before
    assert links[True] != links[False]  # the reordering ranker reads the lexical index it loaded
