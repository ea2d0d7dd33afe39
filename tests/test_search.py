import numpy as np
import pytest
import srsly

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import DOMAIN, Concept, KnowledgeBase
from spacy_conceptnorm.search.sieve import ALL_STRATEGIES, SieveSearcher, Stage, parse_strategy

from .fake_encoder import TrigramEncoder


@pytest.fixture
def small_kb():
    kb = KnowledgeBase()
    kb.add_concept(Concept("D015179", "Colorectal Neoplasms", alt_ids=("OMIM:114500",)), ["Colorectal Cancer"])
    kb.add_concept(Concept("D001943", "Breast Neoplasms"), ["Breast Cancer", "Mammary Cancer"])
    kb.add_concept(Concept("D009369", "Neoplasms"), ["Cancer", "Tumor"])
    kb.add_concept(Concept("D003920", "Diabetes Mellitus"), ["Diabetes"])
    kb.add_names([("CRC", "D015179"), ("colon tumour", "D015179")], DOMAIN)
    return kb


@pytest.fixture
def searcher(small_kb):
    s = SieveSearcher(small_kb, TrigramEncoder(), strategy="D-T+OD-T", threshold=0.95, top_k=3)
    s.build()
    return s


def test_parse_strategy():
    assert parse_strategy("D-T+OD-C") == (Stage("D", "T"), Stage("OD", "C"))
    assert len(ALL_STRATEGIES) == 14 and all(parse_strategy(s) for s in ALL_STRATEGIES)
    for bad in ["X-T", "OD", "O-T+", "D-Q"]:
        with pytest.raises(ConceptNormError, match="Invalid search strategy"):
            parse_strategy(bad)
    with pytest.raises(ConceptNormError, match="top_k"):
        SieveSearcher(KnowledgeBase(), TrigramEncoder(), top_k=0)


def test_sieve_answers_from_domain_first_then_falls_back(searcher):
    crc, breast, empty = searcher.search(["CRC", "breast cancers", "  ,"])
    assert crc.stage == "D-T" and crc.candidates[0][0] == "D015179" and crc.score > 0.999
    assert crc.names[0] == "CRC"
    # no domain name reaches 0.95 for "breast cancers": the ontology stage answers
    assert breast.stage == "OD-T" and breast.candidates[0][0] == "D001943"
    assert [s for _, s in breast.candidates] == sorted((s for _, s in breast.candidates), reverse=True)
    assert len({c for c, _ in breast.candidates}) == len(breast.candidates) <= 3
    assert empty.candidates == [] and empty.stage is None


def test_targets_restrict_what_is_searched(searcher):
    (match,) = searcher.search(["CRC"], strategy="O-T")
    assert match.names[0] != "CRC"  # a domain name is invisible to the ontology target
    (match,) = searcher.search(["Diabetes"], strategy="D-T")
    assert match.candidates[0][0] == "D015179"  # D holds only colorectal names
    (match,) = searcher.search(["Diabetes"], strategy="OD-T")
    assert match.candidates[0][0] == "D003920"


def test_concept_representation_is_the_mean_of_name_vectors():
    kb = KnowledgeBase()
    kb.add_concept(Concept("D001943", "Breast Neoplasms"), ["Breast Cancer", "Mammary Cancer"])
    kb.add_concept(Concept("D009369", "Neoplasms"))
    kb.add_names([("boob cancer", "D001943")], DOMAIN)
    axis = {"breast neoplasms": 0, "breast cancer": 1, "mammary cancer": 2, "boob cancer": 3, "neoplasms": 4}
    vectors = np.eye(5, dtype=np.float32)[[axis[name] for name in kb.names()]]  # each name on its own axis
    searcher = SieveSearcher(kb, TrigramEncoder(), top_k=2)
    searcher.build(vectors=vectors)
    # O-C: D001943 is the mean of its three ontology names' axes, (1, 1, 1, 0, 0) / sqrt(3); the query is one of
    # them, so its cosine is 1 / sqrt(3); with the domain name too (OD-C) it is (1, 1, 1, 1, 0) / 2, cosine 1 / 2
    (match,) = searcher.search(["Mammary Cancer"], strategy="O-C")
    assert match.stage == "O-C" and match.candidates == [("D001943", pytest.approx(0.5773503, abs=1e-6)),
                                                         ("D009369", pytest.approx(0.0, abs=1e-6))]  # fmt: skip
    assert match.names[0] == "Breast Neoplasms"  # -C stages report the canonical name
    (match,) = searcher.search(["Mammary Cancer"], strategy="OD-C")
    assert match.candidates[0] == ("D001943", pytest.approx(0.5, abs=1e-6))


def test_shared_name_tie_break_is_deterministic():
    kb = KnowledgeBase()
    kb.add_concept(Concept("C2", "Anorexia"))
    kb.add_concept(Concept("C1", "Loss of appetite"), ["Anorexia"])
    kb.add_concept(Concept("C3", "Eating disorder"), ["Anorexia"])
    searcher = SieveSearcher(kb, TrigramEncoder(), strategy="O-T", top_k=3)
    searcher.build()
    (match,) = searcher.search(["anorexia"])
    # equal scores: the concept whose canonical name matched first, then ascending ids
    assert [c for c, _ in match.candidates] == ["C2", "C1", "C3"]


def test_known_names_reuse_their_vectors(searcher):
    encoder = searcher.encoder
    encoder.calls.clear()
    searcher.search(["Colorectal cancer", "colorectal  CANCER", "brand new mention", "brand new mention"])
    assert encoder.calls == [["brand new mention"]]  # normalized duplicates and known names are not encoded


def test_add_and_remove_names_take_effect_at_once(searcher, small_kb):
    new, _ = small_kb.add_names([("sugar disease", "D003920")])
    searcher.add_names(new, DOMAIN)
    (match,) = searcher.search(["sugar disease"])
    assert match.stage == "D-T" and match.candidates[0][0] == "D003920"
    searcher.remove_names(small_kb.remove_names([("sugar disease", "D003920")]), DOMAIN)
    (match,) = searcher.search(["sugar disease"])
    assert match.stage == "OD-T" and "sugar disease" not in searcher.rows


def test_a_removed_name_frees_its_row_for_the_next_name_and_gets_it_back_unencoded(searcher, small_kb):
    rows = len(searcher.vectors)
    searcher.add_names(small_kb.add_names([("sugar disease", "D003920")])[0], DOMAIN)
    row = searcher.rows["sugar disease"]
    assert row == rows and len(searcher.vectors) == rows + 1  # appended
    searcher.remove_names(small_kb.remove_names([("sugar disease", "D003920")]), DOMAIN)
    assert searcher.row_names[row] is None and searcher.row_name_ids[row] == -1
    searcher.encoder.calls.clear()
    searcher.add_names(small_kb.add_names([("sugar disease", "D003920")])[0], DOMAIN)
    assert searcher.rows["sugar disease"] == row and searcher.encoder.calls == []  # its vector was kept
    searcher.remove_names(small_kb.remove_names([("sugar disease", "D003920")]), DOMAIN)
    searcher.add_names(small_kb.add_names([("honey disease", "D003920")])[0], DOMAIN)
    assert searcher.rows["honey disease"] == row and len(searcher.vectors) == rows + 1  # the free row, no growth
    assert searcher.name_rows[small_kb.key_id("honey disease")] == row
    (match,) = searcher.search(["honey disease"])
    assert match.stage == "D-T" and match.candidates[0] == ("D003920", pytest.approx(1.0, abs=1e-9))


def test_round_trip_and_mismatch_detection(searcher, small_kb, tmp_path):
    searcher.to_disk(tmp_path / "s")
    loaded = SieveSearcher(small_kb, searcher.encoder, "D-T+OD-T", 0.95, 3).from_disk(tmp_path / "s")
    queries = ["CRC", "breast cancers", "tumour of the colon"]
    assert [m.candidates for m in loaded.search(queries)] == [m.candidates for m in searcher.search(queries)]

    vectors = np.load(tmp_path / "s" / "vectors.npy")
    np.save(tmp_path / "s" / "vectors.npy", vectors[::-1].copy())
    with pytest.raises(ConceptNormError, match="checksum"):
        SieveSearcher(small_kb, searcher.encoder).from_disk(tmp_path / "s")

    searcher.to_disk(tmp_path / "s2")
    other_kb = KnowledgeBase()
    other_kb.add_concept(Concept("X", "Something else"))
    with pytest.raises(ConceptNormError, match="differ"):
        SieveSearcher(other_kb, searcher.encoder).from_disk(tmp_path / "s2")


def test_a_searcher_saved_in_another_format_version_is_refused(searcher, small_kb, tmp_path):
    searcher.to_disk(tmp_path / "s")
    data = srsly.msgpack_loads((tmp_path / "s" / "searcher.msgpack").read_bytes())
    data["version"] = 1
    (tmp_path / "s" / "searcher.msgpack").write_bytes(srsly.msgpack_dumps(data))
    with pytest.raises(ConceptNormError, match=r"E003.*searcher.msgpack.*spacy_conceptnorm.searcher/1"):
        SieveSearcher(small_kb, searcher.encoder).from_disk(tmp_path / "s")


def test_a_float16_row_scores_exactly_one_against_itself():
    from spacy_conceptnorm.search.sieve import exact_scores

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((500, 384)).astype(np.float32)
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float16).astype(np.float32)
    # the rows' norms are not 1 after the float16 rounding: a cosine must still say 1 for the same vector
    assert not np.all(np.linalg.norm(rows.astype(np.float64), axis=1) == 1.0)
    assert all(exact_scores(rows, np.array([i]), rows[i]) == [1.0] for i in range(len(rows)))


def test_answers_do_not_depend_on_how_many_rows_are_scored_at_once(searcher, monkeypatch):
    import spacy_conceptnorm.search.index as index_module
    import spacy_conceptnorm.search.sieve as search_module

    texts = ["colon cancer", "breast tumour", "diabetes", "crc", "mammary neoplasm", "cancer of the colon"]
    # an approximate index: its candidates are rescored from the vector store
    hnsw = SieveSearcher(searcher.kb, TrigramEncoder(), strategy="D-T+OD-T", threshold=0.95, top_k=3,
                         index={"index_type": "hnsw"})  # fmt: skip
    hnsw.build()
    whole = [(m.candidates, m.names, m.stage) for m in hnsw.search(texts, top_k=4)]
    monkeypatch.setattr(search_module, "SCORE_CHUNK", 3)
    monkeypatch.setattr(index_module, "RESCORE_ROWS", 5)
    chunked = [(m.candidates, m.names, m.stage) for m in hnsw.search(texts, top_k=4)]
    assert chunked == whole and all(candidates for candidates, _, _ in whole)
