"""The second stage: lexical candidates, the listwise ranker, calibrated confidence, document consistency."""

from pathlib import Path

import numpy as np
import pytest
import spacy
from scipy import sparse
from spacy.tokens import Span
from spacy.training import Example
from spacy.util import registry

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.linking.candidates import FEATURES, CandidateGenerator
from spacy_conceptnorm.linking.confidence import (
    Confidence,
    expected_calibration_error,
    reliability,
    word_overlap,
)
from spacy_conceptnorm.linking.consistency import initials, make_consistent
from spacy_conceptnorm.linking.lexical import LexicalIndex, row_top, row_values
from spacy_conceptnorm.linking.pair_scorer import PairScorer
from spacy_conceptnorm.linking.ranker import Ranker
from spacy_conceptnorm.search.sieve import SieveSearcher
from spacy_conceptnorm.training.pair_scorer_fit import FitReport
from spacy_conceptnorm.training.ranker_fit import fit_conditional_logit, fit_pair_scorer
from spacy_conceptnorm.training.ranking import ranking_examples, recall_at, reorder_test, train_ranker

from .fake_encoder import TrigramEncoder

NAMES = ["breast cancer", "cancer of the breast", "ovarian cancer", "colon cancer", "ataxia telangiectasia"]


def test_lexical_scores_by_hand():
    index = LexicalIndex().fit(NAMES)
    s = index.scores(["breast cancer", "cancer breast tumour"])
    # tokens {breast, cancer} against {cancer, of, the, breast}: 2 shared of 4 distinct
    assert s["jaccard"][0, 1] == pytest.approx(2 / 4)
    assert s["name_coverage"][0, 1] == pytest.approx(2 / 4) and s["mention_coverage"][0, 1] == pytest.approx(1.0)
    # {cancer, breast, tumour} against {breast, cancer}: all of the name, 2 of 3 of the mention
    assert s["name_coverage"][1, 0] == pytest.approx(1.0) and s["mention_coverage"][1, 0] == pytest.approx(2 / 3)
    assert s["tfidf"][0, 0] == pytest.approx(1.0, abs=1e-5)  # a name is its own nearest
    assert int(np.argmax(s["tfidf"][0])) == 0 and int(np.argmin(s["tfidf"][0])) == 4  # "an" is all they share
    assert s["jaccard"][1, 4] == 0.0


def test_sparse_and_dense_rows_read_alike():
    dense = np.array([[0.0, 0.5, 0.0, 0.9, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    matrix = sparse.csr_matrix(dense)
    for m in (dense, matrix):
        assert row_top(m, 0, 2).tolist() == [3, 1]  # 0.9, then the tie 0.5/0.5 goes to the lower column
        assert row_top(m, 0, 10).tolist() == [3, 1, 4]  # zeros are never candidates
        assert row_top(m, 1, 3).tolist() == []
        assert row_values(m, 0, np.array([4, 0, 3, 3])).tolist() == [0.5, 0.0, pytest.approx(0.9), pytest.approx(0.9)]
        assert row_values(m, 1, np.array([2, 1])).tolist() == [0.0, 0.0]


def test_lexical_index_round_trip_and_added_rows():
    index = LexicalIndex().fit(NAMES[:3])
    index.add(["colon cancer", None])
    assert len(index) == 5
    copy = LexicalIndex().from_bytes(index.to_bytes())
    for key, matrix in index.scores(["colon cancers"]).items():
        dense = matrix.toarray() if hasattr(matrix, "toarray") else matrix
        other = copy.scores(["colon cancers"])[key]
        assert np.array_equal(dense, other.toarray() if hasattr(other, "toarray") else other), key
    assert index.scores(["colon cancer"])["jaccard"][0, 3] == pytest.approx(1.0)
    assert index.scores(["colon cancer"])["jaccard"][0, 4] == 0.0  # a freed row matches nothing


def test_conditional_logit_learns_which_column_marks_the_right_candidate():
    rng = np.random.default_rng(0)
    mats, right = [], []
    for _ in range(200):
        m = rng.normal(size=(6, 3))
        r = np.zeros(6, dtype=bool)
        r[int(np.argmax(m[:, 1]))] = True  # column 1 alone decides; 0 and 2 are noise
        mats.append(m)
        right.append(r)
    w = fit_conditional_logit(mats, right, 1e-3)
    assert w[1] > 5 * max(abs(w[0]), abs(w[2]))
    held_out = rng.normal(size=(50, 6, 3))
    assert all(int(np.argmax(m @ w)) == int(np.argmax(m[:, 1])) for m in held_out)


def test_ece_and_reliability_by_hand():
    probs, correct = [0.95, 0.95, 0.15, 0.15], [True, False, False, False]
    bins = reliability(probs, correct)
    assert [(b["count"], b["accuracy"]) for b in bins] == [(2, 0.0), (2, 0.5)]
    # |0 - 0.15| x 1/2 + |0.5 - 0.95| x 1/2
    assert expected_calibration_error(probs, correct) == pytest.approx(0.075 + 0.225)
    assert expected_calibration_error([1.0, 0.0], [True, False]) == 0.0


def test_confidence_model_orders_evidence_and_needs_both_outcomes():
    rng = np.random.default_rng(1)
    evidence, correct = [], []
    for _ in range(300):
        score = float(rng.uniform())
        evidence.append({"score": score, "margin": score / 2, "dense": score, "exact": 0.0, "domain_stage": 0.0})
        correct.append(bool(rng.uniform() < score))  # right about as often as the score says
    conf = Confidence().fit(evidence, correct)
    low, high = conf(
        [
            {**evidence[0], "score": 0.1, "margin": 0.05, "dense": 0.1},
            {**evidence[0], "score": 0.9, "margin": 0.45, "dense": 0.9},
        ]
    )
    assert low < 0.35 < 0.65 < high
    assert expected_calibration_error(conf(evidence), correct) < 0.08
    assert conf([{}])[0] == 0.0  # nothing found: no confidence
    restored = Confidence().from_dict(conf.to_dict())
    assert np.allclose(restored(evidence), conf(evidence))
    with pytest.raises(ConceptNormError, match="right and wrong"):
        Confidence().fit(evidence[:5], [True] * 5)


def test_word_overlap_of_mention_and_answering_name():
    # {hereditary, ovarian, cancer} against {ovarian, neoplasms}: one shared word of four
    assert word_overlap("hereditary ovarian cancer", "Ovarian Neoplasms") == pytest.approx(
        {"jaccard": 1 / 4, "mention_left": 2 / 3, "name_left": 1 / 2}
    )
    assert word_overlap("Breast Cancer", "breast cancer") == {"jaccard": 1.0, "mention_left": 0.0, "name_left": 0.0}
    assert word_overlap("", "") == {"jaccard": 0.0, "mention_left": 0.0, "name_left": 0.0}


def test_confidence_weights_out_of_kb_links_and_refuses_a_model_that_does_not_fit(tmp_path):
    rng = np.random.default_rng(2)
    right = [{"score": float(s), "jaccard": 1.0} for s in rng.uniform(0.8, 1.0, 200)]
    # links of missing concepts: as close by cosine, but the answering name shares half the words
    out = [{"score": float(s), "jaccard": 0.5, "mention_left": 0.5} for s in rng.uniform(0.8, 1.0, 200)]
    wrong = [{"score": float(s), "jaccard": 1.0} for s in rng.uniform(0.5, 0.8, 50)]
    light = Confidence().fit(right + wrong + out, [True] * 200 + [False] * 250, [1.0] * 250 + [0.01] * 200)
    heavy = Confidence().fit(right + wrong + out, [True] * 200 + [False] * 250, [1.0] * 250 + [1.0] * 200)
    probe = {"score": 0.9, "jaccard": 0.5, "mention_left": 0.5}
    assert heavy([probe])[0] < light([probe])[0]
    assert heavy([probe])[0] < 0.5 < heavy([{"score": 0.9, "jaccard": 1.0}])[0]
    # read back from its saved columns: 10 x score - 9 for a score of 1 is a logit of 1
    saved = Confidence().from_dict({"coef": [10.0, 0.0], "intercept": -9.0, "columns": ["score", "jaccard"]})
    assert saved([{"score": 1.0, "jaccard": 0.0}])[0] == pytest.approx(1 / (1 + np.exp(-1.0)))
    five = ["score", "margin", "dense", "exact", "domain_stage"]
    with pytest.raises(ConceptNormError, match=r"E004.*models\.json.*3 weights"):
        Confidence().from_dict({"coef": [1.0, 2.0, 3.0], "intercept": 0.0, "columns": five}, tmp_path / "models.json")
    # a model without its column list (there never was a release without one) is refused, not guessed at
    with pytest.raises(ConceptNormError, match=r"E004.*models\.json.*without 'columns'"):
        Confidence().from_dict({"coef": [1.0] * 5, "intercept": 0.0}, tmp_path / "models.json")
    with pytest.raises(ConceptNormError, match="E004.*confidence model"):
        Confidence().from_dict({"coef": [1.0] * 5, "intercept": "high", "columns": five})
    with pytest.raises(ConceptNormError, match="E004.*confidence model"):
        Confidence().from_dict({"coef": [1.0], "intercept": 0.0, "columns": [["score"]]})


@pytest.fixture
def searcher(fixtures):
    kb = load_kb(fixtures / "medic_sample.txt")
    searcher = SieveSearcher(kb, TrigramEncoder(), "OD-T", top_k=5)
    searcher.build()
    return searcher


def test_candidates_add_lexical_finds_and_describe_every_concept(searcher):
    generator = CandidateGenerator(searcher, lexical_k=5)
    generator.build()
    keys = ["colorectal cancer", "colorectal neoplasms"]
    vectors = searcher.query_vectors(keys)
    found = searcher.search_keys(keys, top_k=2, vectors=vectors)
    sets = generator.generate(keys, [found[k] for k in keys], vectors)
    first = sets[0]
    assert first.concept_ids[:2] == [c for c, _ in found[keys[0]].candidates]  # the sieve's order first
    assert len(first.concept_ids) > 2  # lexical finds beyond the sieve's two
    assert first.features.shape == (len(first.concept_ids), len(FEATURES))
    exact = sets[1]
    assert exact.exact and exact.features[0, FEATURES.index("exact")] == 1.0
    dense, gap = first.features[:, FEATURES.index("dense")], first.features[:, FEATURES.index("dense_gap")]
    assert gap[int(np.argmax(dense))] == 0 and (gap >= 0).all()  # the gap to the best dense score
    assert (np.diff(gap[np.argsort(-dense)]) >= 0).all() and len(set(gap.tolist())) > 1  # grows as dense falls
    searcher.hidden = frozenset({exact.concept_ids[0]})
    hidden = generator.generate(keys[1:], [searcher.search_keys(keys[1:], top_k=2)[keys[1]]], vectors[1:])[0]
    assert exact.concept_ids[0] not in hidden.concept_ids and not hidden.exact


def test_ranker_rejects_bad_settings():
    with pytest.raises(ConceptNormError, match="ranker model"):
        Ranker("gbdt")
    with pytest.raises(ConceptNormError, match="lexical_k"):
        Ranker(lexical_k=0)
    with pytest.raises(ConceptNormError, match="PairScorer"):
        Ranker(scorers={"cnn": "not a scorer"})
    with pytest.raises(ConceptNormError, match="'confidence_scorer' must be a PairScorer"):
        Ranker(confidence_scorer={"epochs": 3})
    with pytest.raises(ConceptNormError, match="may not be named 'confidence_scorer'"):
        Ranker(scorers={"confidence_scorer": ShareOfLetters()}, confidence_scorer=ShareOfLetters())
    for bad in [(3, 2), (0, 3), (3,), [2, 3, 4], (2.0, 3), "33", (True, 3)]:
        with pytest.raises(ConceptNormError, match="ngram_range"):
            Ranker(ngram_range=bad)


def test_dense_features_are_maxima_over_every_name_of_the_concept(searcher):
    generator = CandidateGenerator(searcher, lexical_k=5)
    generator.build()
    key = "colorectal cancer"
    vector = searcher.query_vectors([key])
    found = searcher.search_keys([key], top_k=2, vectors=vector)
    candidates = generator.generate([key], [found[key]], vector)[0]
    dense = candidates.features[:, FEATURES.index("dense")]
    for concept_id, value in zip(candidates.concept_ids, dense):
        names = searcher.kb.concept_names(concept_id)  # a scan of every link, not the generator's arrays
        cosines = [float(searcher.vectors[searcher.rows[n]] @ vector[0]) for n in names if n in searcher.rows]
        assert value == pytest.approx(max(cosines), abs=1e-6)


def test_ngram_range_reaches_the_lexical_index_and_is_saved(train_docs, kb, tmp_path):
    nlp = spacy.blank("en")
    ranker = {"@misc": "spacy_conceptnorm.ranker.v1", "ngram_range": [2, 4]}
    normalizer = nlp.add_pipe("concept_normalizer", config={"strategy": "D-T+OD-T", "ranker": ranker})
    normalizer.encoder = TrigramEncoder()
    normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
    assert normalizer.linker.candidate_generator().lexical.ngram_range == (2, 4)
    assert max(map(len, normalizer.linker.candidate_generator().lexical.tfidf.vocabulary_)) == 4
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p").get_pipe("concept_normalizer")
    assert loaded.ranker.ngram_range == (2, 4) and loaded.linker.candidate_generator().lexical.ngram_range == (2, 4)


def linker_pipeline(train_docs, kb):
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer", config={"strategy": "D-T+OD-T"})
    normalizer.encoder = TrigramEncoder()
    normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
    return nlp, normalizer


def test_train_ranker_on_folds_then_link_and_save(train_docs, test_docs, kb, tmp_path):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    examples = ranking_examples(nlp, train_docs, folds=3, log=lambda _: None)
    assert examples and recall_at(examples, 0) >= recall_at(examples, 1)
    # a fold's own mentions are hidden from the domain names: not every example is a known name
    assert any(not e.candidates.exact for e in examples)
    report = train_ranker(nlp, train_docs, test_docs, folds=3, log=lambda _: None)
    assert normalizer.ranker.is_fitted and report["fit"]["sets"] > 0
    assert set(report["fit"]["coef"]) == {"dense", "tfidf", "count_prior"}
    doc = nlp.make_doc("Patients with colorectal tumours and breast cancer.")
    doc.ents = [Span(doc, 2, 4, "Disease"), Span(doc, 5, 7, "Disease")]
    linked = normalizer(doc)
    for ent in linked.ents:
        assert isinstance(ent._.kb_ents, list) and all(isinstance(c, str) for c, _ in ent._.kb_ents)
    # by hand from the MEDIC sample: Colorectal Neoplasms, and Breast Neoplasms, of which "Breast Cancer" is a name
    # (an exact name: cosine 1); with no confidence model fitted, the confidence is the top candidate's cosine
    colorectal, breast = linked.ents
    assert (colorectal.kb_id_, breast.kb_id_) == ("D015179", "D001943")
    assert colorectal._.kb_confidence == colorectal._.kb_ents[0][1] < 0.99
    assert breast._.kb_confidence == breast._.kb_ents[0][1] == pytest.approx(1.0)
    before = [(e.kb_id_, e._.kb_ents, e._.kb_confidence) for e in linked.ents]
    nlp.to_disk(tmp_path / "p")
    reloaded = spacy.load(tmp_path / "p")
    reloaded.get_pipe("concept_normalizer").searcher.encoder = TrigramEncoder()  # saved by reference only
    doc2 = nlp.make_doc(doc.text)
    doc2.ents = [Span(doc2, 2, 4, "Disease"), Span(doc2, 5, 7, "Disease")]
    after = [(e.kb_id_, e._.kb_ents, e._.kb_confidence) for e in reloaded(doc2).ents]
    assert after == before
    assert reloaded.get_pipe("concept_normalizer").ranker.counts == normalizer.ranker.counts


def test_train_ranker_keeps_reordering_only_when_dev_says_it_helps(train_docs, test_docs, kb, tmp_path):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    report = train_ranker(nlp, train_docs, test_docs, folds=3, log=lambda _: None, alpha=1.0)
    dev = report["dev"]
    assert report["reorder"] is normalizer.ranker.reorder
    sign = dev["sign_test"]
    assert sign["alpha"] == 1.0
    assert round((dev["ranker_acc1"] - dev["sieve_acc1"]) * dev["examples"]) == sign["wins"] - sign["losses"]
    ranker = normalizer.ranker
    examples = ranking_examples(nlp, test_docs, folds=1, log=lambda _: None)
    sets = [e.candidates for e in examples]
    mentions, contexts = [e.mention for e in examples], [e.context for e in examples]
    ranker.reorder = True
    reordered = ranker.rerank(sets, mentions, contexts, 5)
    ranker.reorder = False
    kept = ranker.rerank(sets, mentions, contexts, 5)
    # off: every set keeps the sieve's candidates and cosines; on: the sets off the fast path carry probabilities
    assert [m.candidates for m in kept] == [s.sieve.candidates for s in sets]
    assert any(m.candidates != s.sieve.candidates for m, s in zip(reordered, sets))
    # and the linker then answers from the sieve alone, without building candidate sets
    keys = [normalizer.kb.normalizer(m) for m in mentions]
    normalizer.linker.candidate_sets = None  # would raise if called
    linked = normalizer.linker.link(mentions)
    del normalizer.linker.candidate_sets
    sieve = normalizer.searcher.search_keys(keys)
    assert [m.candidates for m in linked] == [sieve[k].candidates for k in keys]
    nlp.to_disk(tmp_path / "p")
    assert not (tmp_path / "p" / "concept_normalizer" / "linker" / "lexical.msgpack").exists()  # never read
    reloaded = spacy.load(tmp_path / "p").get_pipe("concept_normalizer").ranker
    assert reloaded.reorder is False and reloaded.is_fitted
    data = ranker.weights_to_dict()
    assert sorted(data) == ["coef", "mean", "reorder", "scale"]  # no intercept: the softmax has no use for one
    ranker.weights_from_dict({**data, "reorder": True, "intercept": [0.0]})  # a key it does not read is ignored
    assert ranker.reorder is True
    with pytest.raises(ConceptNormError, match="E004.*ranker reorder"):
        ranker.weights_from_dict({**data, "reorder": "no"})
    # weights without the setting (there never was a release without it) are refused, not guessed at
    del data["reorder"]
    with pytest.raises(ConceptNormError, match="E004.*without 'reorder'"):
        ranker.weights_from_dict(data)
    assert ranker.reorder is True and ranker.is_fitted  # a refused file changes nothing


@pytest.mark.parametrize(
    "alpha,reorder",  # 3 wins against 1 loss: P(X >= 3 | n=4, 1/2) = (4 + 1) / 16 = 0.3125
    [(1.0, True), (0.32, True), (0.31, False)],
)
def test_train_ranker_reorders_on_the_sign_test_of_the_dev_hits(train_docs, test_docs, kb, monkeypatch, alpha, reorder):
    import spacy_conceptnorm.training.ranking as training

    def hits(normalizer, examples, reranked):
        """By hand: the ranker alone right on the first 3 queries, the sieve alone on the 4th, both on the rest."""
        right = [True] * len(examples)
        if reranked:
            right[3] = False
        else:
            right[:3] = [False] * 3
        return right

    monkeypatch.setattr(training, "top1_hits", hits)
    nlp, normalizer = linker_pipeline(train_docs, kb)
    report = train_ranker(nlp, train_docs, test_docs, folds=3, log=lambda _: None, alpha=alpha)
    assert report["dev"]["sign_test"] == {"wins": 3, "losses": 1, "p_value": 0.3125, "alpha": alpha}
    assert report["reorder"] is normalizer.ranker.reorder is reorder


def test_reorder_test_is_an_exact_one_sided_sign_test():
    def hits(wins, losses, both=5, neither=3):
        sieve = [False] * wins + [True] * losses + [True] * both + [False] * neither
        ranker = [True] * wins + [False] * losses + [True] * both + [False] * neither
        return sieve, ranker

    # 13 against 12 of 25 differing queries: P(X >= 13 | n=25, 1/2) = 1/2 exactly, a coin flip
    assert reorder_test(*hits(13, 12)) == {"wins": 13, "losses": 12, "p_value": 0.5, "reorder": False}
    # 9 against 1: (C(10,9) + C(10,10)) / 2**10 = 11/1024
    assert reorder_test(*hits(9, 1)) == {"wins": 9, "losses": 1, "p_value": 0.010742, "reorder": True}
    # 8 against 2: (45 + 10 + 1) / 1024 = 0.0547, above 0.05; alpha 1.0 keeps any net win, never a tie
    assert reorder_test(*hits(8, 2))["reorder"] is False
    assert reorder_test(*hits(8, 2), alpha=0.06)["reorder"] is True
    assert reorder_test(*hits(13, 12), alpha=1.0)["reorder"] is True
    assert reorder_test(*hits(4, 4), alpha=1.0)["reorder"] is False
    assert reorder_test(*hits(0, 0)) == {"wins": 0, "losses": 0, "p_value": 1.0, "reorder": False}


def test_nil_is_decided_on_confidence(train_docs, kb):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    doc = nlp.make_doc("A colorectal tumour.")
    doc.ents = [Span(doc, 1, 3, "Disease")]
    ent = normalizer(doc).ents[0]
    assert ent.kb_id_ != "NIL"
    normalizer.cfg["nil_threshold"] = ent._.kb_confidence + 1e-6
    doc.ents = [Span(doc, 1, 3, "Disease")]
    assert normalizer(doc).ents[0].kb_id_ == "NIL"


def test_initials():
    assert initials("Duchenne muscular dystrophy") == "DMD"
    assert initials("hereditary non-polyposis colorectal cancer") == "HNPCC"
    assert initials("disease of the heart") == "DH"


def linked_spans(doc, links):
    """Set `doc.ents` to spans (start, end, concept id, confidence) linked as concept_normalizer links them."""
    spans = []
    for start, end, cid, conf in links:
        span = Span(doc, start, end, "Disease", kb_id=cid)
        record = {"text": span.text, "kb_id": cid, "candidates": [(cid, conf)], "name": "x", "stage": "OD-T"}
        span._.kb_parts = [{**record, "confidence": conf}]
        span._.kb_ents, span._.kb_confidence, span._.kb_name = [(cid, conf)], conf, "x"
        spans.append(span)
    doc.ents = spans


def test_one_text_one_concept_in_a_document():
    import spacy_conceptnorm.pipeline.abbreviation_resolver  # noqa: F401  (registers Span._.long_form)

    nlp = spacy.blank("en")
    doc = nlp("Breast cancer is common . breast cancer kills . Breast Cancer again . breast cancer once more")
    # D001943 carries 0.6 + 0.5 of confidence, D010051 0.7 (unconfident) and 0.95 (confident, kept)
    linked_spans(doc, [(0, 2, "D001943", 0.6), (5, 7, "D001943", 0.5), (9, 11, "D010051", 0.7)])
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.0) == 1
    assert [e.kb_id_ for e in doc.ents] == ["D001943"] * 3
    assert doc.ents[2]._.kb_confidence == 0.6 and doc.ents[2]._.kb_stage == "consistency"  # the best donor's
    linked_spans(doc, [(0, 2, "D001943", 0.6), (5, 7, "D001943", 0.5), (9, 11, "D010051", 0.95)])
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.0) == 0
    # the donor's confidence is under the NIL threshold: the changed link becomes NIL
    linked_spans(doc, [(0, 2, "D001943", 0.6), (5, 7, "D001943", 0.5), (9, 11, "D010051", 0.4)])
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.65) == 1
    assert [e.kb_id_ for e in doc.ents] == ["D001943", "D001943", "NIL"]
    # an abbreviation defined in the text (its long form found) keeps its own link
    doc = nlp("Duchenne muscular dystrophy is severe . DMD boys walk late")
    linked_spans(doc, [(0, 3, "D020388", 0.95), (6, 7, "D009136", 0.4)])
    doc.ents[1]._.long_form = "dystrophia myotonica type D"
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.0) == 0


def test_undefined_abbreviation_takes_the_concept_it_stands_for():
    nlp = spacy.blank("en")
    doc = nlp("Duchenne muscular dystrophy is severe. DMD boys walk late.")
    linked_spans(doc, [(0, 3, "D020388", 0.95), (6, 7, "D009136", 0.4)])
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.0) == 1
    assert [e.kb_id_ for e in doc.ents] == ["D020388", "D020388"]
    assert doc.ents[1]._.kb_stage == "consistency" and doc.ents[1]._.kb_ents[0] == ("D020388", 0.95)
    # a confident link keeps its own concept
    doc.ents[1]._.kb_confidence = 0.99
    doc.ents = [doc.ents[0], Span(doc, 6, 7, "Disease", kb_id="D009136")]
    doc.ents[1]._.kb_confidence = 0.99
    assert make_consistent(doc, list(doc.ents), lambda t: t.lower(), nil_threshold=0.0) == 0


def test_cache_answers_repeats_and_forgets_on_change(train_docs, kb):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    linker = normalizer.linker
    first = linker.link(["colorectal tumours", "colorectal tumours", "breast cancer"])
    assert (linker.cache_lookups, linker.cache_hits) == (2, 0)  # distinct texts looked up once
    again = linker.link(["colorectal tumours"])
    assert linker.cache_hits == 1 and again[0].candidates == first[0].candidates
    again[0].candidates.clear()  # a caller changing its Match does not change the cache
    assert linker.link(["colorectal tumours"])[0].candidates == first[0].candidates
    top = first[0].candidates[0][0]
    other = next(c for c in kb.concepts if c != top)
    normalizer.add_synonyms([("colorectal tumours", other)])  # a new synonym answers at once
    assert linker.link(["colorectal tumours"])[0].candidates[0][0] in {top, other}
    assert other in [c for c, _ in linker.link(["colorectal tumours"])[0].candidates]
    hits = linker.cache_hits
    normalizer.set_strategy("OD-T")  # another sieve: nothing cached applies
    linker.link(["breast cancer"])
    assert linker.cache_hits == hits


def test_methods_before_initialize_raise_the_package_error():
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer")
    for call in (
        lambda: normalizer.set_strategy("OD-T"),
        lambda: normalizer.remove_synonyms([("a", "D1")]),
        lambda: normalizer.add_synonyms([("a", "D1")]),
        lambda: normalizer.score([]),
        lambda: normalizer.to_bytes(),
        lambda: nlp.to_bytes(),
    ):
        with pytest.raises(ConceptNormError, match=r"^\[E301\] .*initialize\(nlp=nlp, kb=kb\)"):
            call()


def test_pipe_hands_errors_to_the_pipelines_error_handler(train_docs, kb):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    seen = []
    nlp.set_error_handler(lambda name, comp, docs, e: seen.append((name, len(docs), type(e).__name__)))
    doc = nlp.make_doc("A colorectal tumour.")
    doc.ents = [Span(doc, 1, 3, "Disease")]
    original = normalizer.linker.link
    normalizer.linker.link = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    try:
        assert list(normalizer.pipe([doc])) == []  # the failed batch is handed over, not yielded
    finally:
        normalizer.linker.link = original
    assert seen == [("concept_normalizer", 1, "RuntimeError")]


def test_a_bad_synonym_changes_nothing(train_docs, kb, tmp_path):
    nlp, normalizer = linker_pipeline(train_docs, kb)
    names = sorted(normalizer.kb.names())
    with pytest.raises(ConceptNormError, match="pairs"):
        normalizer.add_synonyms([("a brand new text", "D001943"), None])
    assert sorted(normalizer.kb.names()) == names
    nlp.to_disk(tmp_path / "p")  # still saves a pipeline that loads
    assert sorted(spacy.load(tmp_path / "p").get_pipe("concept_normalizer").kb.names()) == names


class ShareOfLetters(PairScorer):
    """A test pair scorer: the share of the mention's letters found in the name, times a fitted factor."""

    name = "letters"

    def __init__(self):
        self.factor = 1.0
        self.contexts: list[str] = []  # what the linker passed, to check it

    def fit(self, groups, dev=None, *, seed=0, log=print):
        self.factor = 2.0
        return FitReport(0.0, 1)

    def score(self, mentions, names, contexts=None):
        self.contexts.extend(contexts or [])
        return [
            np.array([self.factor * len(set(m.lower()) & set(n.lower())) / max(1, len(set(m))) for n in ns])
            for m, ns in zip(mentions, names)
        ]

    def to_disk(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "factor.txt").write_text(str(self.factor))

    def from_disk(self, path):
        self.factor = float((Path(path) / "factor.txt").read_text())
        return self


def test_a_pair_scorer_without_a_trainer_is_refused_by_name():
    class Untrainable(ShareOfLetters):
        fit = None

    assert fit_pair_scorer(ShareOfLetters(), []).epochs == 1  # its own fit
    with pytest.raises(ConceptNormError, match=r"E723.*Untrainable"):
        fit_pair_scorer(Untrainable(), [])


@registry.misc("test.share_of_letters.v1")
def make_share_of_letters() -> PairScorer:
    return ShareOfLetters()


def test_pair_scorer_column_is_trained_saved_and_loaded(train_docs, test_docs, kb, tmp_path):
    nlp = spacy.blank("en")
    ranker = {"@misc": "spacy_conceptnorm.ranker.v1", "scorers": {"letters": {"@misc": "test.share_of_letters.v1"}}}
    normalizer = nlp.add_pipe("concept_normalizer", config={"ranker": ranker})
    normalizer.encoder = TrigramEncoder()
    normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
    report = train_ranker(nlp, train_docs, test_docs, folds=3, log=lambda _: None)
    assert list(report["fit"]["coef"]) == ["dense", "tfidf", "count_prior", "letters"]
    assert normalizer.ranker.scorers["letters"].factor == 2.0
    normalizer.ranker.reorder = True  # whatever dev chose on this fixture: the scorer is asked only when reordering
    nlp.to_disk(tmp_path / "p")
    assert (tmp_path / "p" / "concept_normalizer" / "linker" / "scorers" / "letters" / "factor.txt").exists()
    loaded = spacy.load(tmp_path / "p").get_pipe("concept_normalizer")
    assert loaded.ranker.scorers["letters"].factor == 2.0
    assert np.allclose(loaded.ranker.weights["coef"], normalizer.ranker.weights["coef"])
    # a pair scorer gets each mention in its window of the document, marked with brackets
    doc = nlp.make_doc("Patients with colorectal tumours were seen.")
    doc.ents = [Span(doc, 2, 4, "Disease")]
    scorer = normalizer.ranker.scorers["letters"]
    scorer.contexts.clear()
    normalizer(doc)
    assert "Patients with [colorectal tumours] were seen." in scorer.contexts


def test_mention_and_long_form_ties_ignore_float_noise():
    from spacy_conceptnorm.pipeline.concept_normalizer import _preference
    from spacy_conceptnorm.search.sieve import Match

    mention = ("AS", Match([("D1", 0.99999994)], ["as"], "OD-T", {}, 1.0))
    long_form = ("angelman syndrome", Match([("D2", 1.00000012)], ["angelman syndrome"], "OD-T", {}, 1.0))
    assert max([mention, long_form], key=_preference)[0] == "AS"  # exact matches both: a tie, the mention wins
    surer = ("angelman syndrome", Match([("D2", 0.97)], ["angelman syndrome"], "OD-T", {}, 1.0 - 1e-3))
    assert max([mention, surer], key=_preference)[0] == "AS"
    better = ("angelman syndrome", Match([("D2", 0.97)], ["angelman syndrome"], "OD-T", {}, 1.0))
    weaker = ("AS", Match([("D1", 0.91)], ["as"], "OD-T", {}, 1.0))
    assert max([weaker, better], key=_preference)[0] == "angelman syndrome"  # same confidence: the higher score


class NameLength(ShareOfLetters):
    """A test confidence scorer: the name's length in characters / 100, times the fitted factor; it records the
    (mention, names) pairs it is asked."""

    name = "name_length"

    def __init__(self):
        super().__init__()
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def score(self, mentions, names, contexts=None):
        self.asked.extend((m, tuple(ns)) for m, ns in zip(mentions, names))
        return [np.array([self.factor * len(n) / 100 for n in ns]) for ns in names]


@registry.misc("test.name_length.v1")
def make_name_length() -> PairScorer:
    return NameLength()


def test_confidence_scorer_scores_answers_that_are_no_known_name(train_docs, test_docs, kb, tmp_path):
    nlp = spacy.blank("en")
    ranker = {"@misc": "spacy_conceptnorm.ranker.v1", "confidence_scorer": {"@misc": "test.name_length.v1"}}
    normalizer = nlp.add_pipe("concept_normalizer", config={"ranker": ranker})
    normalizer.encoder = TrigramEncoder()
    normalizer.initialize(lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=kb)
    report = train_ranker(nlp, train_docs, test_docs, folds=3, log=lambda _: None)
    assert set(report["fit"]["coef"]) == {"dense", "tfidf", "count_prior"}  # evidence, not a ranking column
    scorer = normalizer.ranker.confidence_scorer
    assert scorer.factor == 2.0 and "confidence_scorer_seconds" in report
    scorer.asked.clear()
    unknown, known = normalizer.linker.link(["Colorectal tumours", "breast cancer"])
    assert unknown.evidence["exact"] == 0.0 and known.evidence["exact"] == 1.0
    # the normalized mention and the answering name, once; a known name is not asked and gets 0
    assert scorer.asked == [("colorectal tumours", (unknown.names[0],))]
    assert unknown.evidence["pair_score"] == pytest.approx(0.02 * len(unknown.names[0]))
    assert known.evidence["pair_score"] == 0.0
    # the confidence model reads the column only where the evidence has it
    rng = np.random.default_rng(3)
    evidence = [{"score": float(s), "pair_score": float(p)} for s, p in rng.uniform(size=(100, 2))]
    correct = [e["pair_score"] > 0.5 for e in evidence]
    with_scorer = Confidence().fit(evidence, correct)
    assert "pair_score" in with_scorer.columns
    low, high = with_scorer([{"score": 0.5, "pair_score": 0.1}, {"score": 0.5, "pair_score": 0.9}])
    assert low < 0.5 < high
    assert "pair_score" not in Confidence().fit([{"score": e["score"]} for e in evidence], correct).columns
    # saved and loaded with the pipeline, on disk and as bytes
    nlp.to_disk(tmp_path / "p")
    assert (tmp_path / "p" / "concept_normalizer" / "linker" / "confidence_scorer" / "factor.txt").exists()
    for loaded in (
        spacy.load(tmp_path / "p").get_pipe("concept_normalizer"),
        spacy.blank("en").from_config(nlp.config).get_pipe("concept_normalizer").from_bytes(normalizer.to_bytes()),
    ):
        assert loaded.ranker.confidence_scorer.factor == 2.0
        loaded.searcher.encoder = TrigramEncoder()  # saved by reference only
        again = loaded.linker.link(["Colorectal tumours"])[0]
        assert again.evidence["pair_score"] == unknown.evidence["pair_score"]
