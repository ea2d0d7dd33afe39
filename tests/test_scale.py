"""Knowledge bases of millions of names in bounded memory: the compact KB tables, the float16 vector store shared
by the searcher and its indexes, memory-mapped loading, the index type chosen by size, the streamed MRCONSO
loader, the lexical index switched off over its limit. Small data; the sizes themselves are measured by
`python -m benchmarks.scale`."""

import pickle
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
import srsly

from benchmarks.scale import make_queries, write_mrconso
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.compact import LinkLists, StringTable
from spacy_conceptnorm.kb.formats import read_mrconso
from spacy_conceptnorm.kb.knowledge_base import DOMAIN, ONTOLOGY, SOURCE_BITS, Concept, KnowledgeBase, load_kb
from spacy_conceptnorm.linking.lexical import LexicalIndex
from spacy_conceptnorm.search import index as index_module
from spacy_conceptnorm.search import vector_store as vector_store_module
from spacy_conceptnorm.search.index import VectorIndex, choose_index_type
from spacy_conceptnorm.search.sieve import SieveSearcher
from spacy_conceptnorm.search.vector_store import VectorStore

from .fake_encoder import TrigramEncoder


def unit(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


# --- compact tables -------------------------------------------------------------------------------------------------
def test_string_table_finds_every_string_across_growth_and_renewal():
    table = StringTable()
    words = [f"name {i} \u00e9\U0001f600" for i in range(5000)] + ["lone \ud800 surrogate", ""]
    ids = [table.add(w) for w in words]
    assert ids == list(range(len(words))) and table.add("name 7 \u00e9\U0001f600") == 7  # kept once
    assert [table.get(w) for w in words] == ids and table.get("absent") == -1
    assert table[len(words) - 2] == "lone \ud800 surrogate"
    renewed = table.renew("name 3 \u00e9\U0001f600")  # a new id, last; the old one is not found any more
    assert renewed == len(words) and table.get("name 3 \u00e9\U0001f600") == renewed and table[3] == table[renewed]
    for i in range(5000, 9000):  # grow past the table size: the renewed string is still found once, by its new id
        table.add(f"more {i}")
    assert table.get("name 3 \u00e9\U0001f600") == renewed and table.get("more 8999") == len(table) - 1
    copy = StringTable.from_dict(srsly.msgpack_loads(srsly.msgpack_dumps(table.to_dict())))
    assert list(copy) == list(table) and copy.digest() == table.digest()
    assert copy.get("name 3 \u00e9\U0001f600") == renewed


def test_link_lists_keep_order_and_reuse_dropped_links():
    links = LinkLists()
    links.add(0, 7, 1)
    links.add(0, 3, 2)
    links.add(0, 7, 2)  # the same target: its bits grow, no second link
    assert list(links.links(0)) == [(0, 7, 3), (1, 3, 2)] and links.owner_bits[0] == 3
    assert links.clear(0, 7, 1) and not links.clear(0, 7, 1) and links.targets(0, 1) == []
    assert links.clear(0, 3, 2) and links.targets(0) == [7] and links.owner_bits[0] == 2
    links.add(1, 5, 1)  # takes the dropped link
    assert len(links.next) == 2 and links.targets(1) == [5]


def test_compact_kb_behaves_as_the_dict_kb_on_the_fixture(kb, tmp_path):
    """The values a plain dict-of-lists KB (an independent implementation) gives for the same calls on the MEDIC
    sample."""
    assert len(kb) == 327 and len(kb.names()) == 2466
    assert kb.names()[:3] == ["lymphedema hereditary ib", "lmph1b", "fibrous dysplasia polyostotic"]
    assert kb.concepts_for("lmph1b") == ["C567452"] and kb.surface("lmph1b") == "LMPH1B"
    assert kb.concept_names("C567452") == ["lymphedema hereditary ib", "lmph1b"]
    # a name removed from every concept and added again is a new name, last in order (as in a dict)
    kb.remove_names([("lmph1b", None)], ONTOLOGY)
    assert "lmph1b" not in kb.names() and kb.concepts_for("lmph1b") == [] and kb.surface("lmph1b") == "lmph1b"
    new, unknown = kb.add_names([("LMPH-1B", "C567452"), ("x", "NOPE")])
    assert new == ["lmph 1b"] and unknown == ["NOPE"]
    assert kb.add_names([("Lmph1b", "MESH:C567452")])[0] == ["lmph1b"]
    assert kb.names()[-2:] == ["lmph 1b", "lmph1b"] and kb.surface("lmph1b") == "Lmph1b"
    assert kb.names(DOMAIN) == ["lmph 1b", "lmph1b"] and kb.concepts_for("lmph1b", SOURCE_BITS[ONTOLOGY]) == []
    restore = kb.saved_names(["lmph1b", "brand new"])
    kb.add_names([("brand new", "C567452"), ("lmph1b", "D005359")])
    restore()
    assert kb.concepts_for("brand new") == [] and kb.concepts_for("lmph1b") == ["C567452"]
    kb.to_disk(tmp_path / "kb.kb")
    loaded = load_kb(tmp_path / "kb.kb")
    assert loaded.names() == kb.names() and loaded.names(DOMAIN) == kb.names(DOMAIN)
    assert [loaded.concepts_for(n, 2) for n in kb.names()] == [kb.concepts_for(n, 2) for n in kb.names()]
    assert loaded.concepts == kb.concepts and loaded.names_digest() == kb.names_digest()
    assert loaded.canonical_key("C567452") == "lymphedema hereditary ib"


def test_the_compact_kb_takes_tens_of_bytes_per_name(tmp_path):
    path = tmp_path / "MRCONSO.RRF"
    write_mrconso(path, 2000)
    tracemalloc.start()
    kb = load_kb(path)  # streamed: the file is never held whole
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    names = len(kb.names())
    assert names > 1900
    assert kb.nbytes() / names < 150  # about 60 bytes of UTF-8 text and 70 of arrays and hash table per name
    assert peak / names < 400


# --- the MRCONSO loader streams -------------------------------------------------------------------------------------
def test_mrconso_is_read_one_cui_at_a_time(tmp_path):
    rows = [
        "C0000001|ENG|S|L1|VO|S1|N|A1||||MSH|SY|D1|Sugar disease|0|N||",
        "C0000001|ENG|P|L2|PF|S2|Y|A2||||MSH|MH|D1|Diabetes Mellitus|0|N||",
        "C0000002|FRE|P|L3|PF|S3|Y|A3||||MSHFRE|MH|D2|Diabète|0|N||",
        "C0000003|ENG|P|L4|PF|S4|Y|A4||||MSH|MH|D3|Hypertension|0|N||",
        "a broken line",
    ]
    path = tmp_path / "MRCONSO.RRF"
    path.write_text("\n".join(rows) + "\n")
    records = read_mrconso(path)
    concept, synonyms = next(records)  # read before the broken line is reached
    assert (concept.concept_id, concept.canonical_name) == ("C0000001", "Diabetes Mellitus")
    assert synonyms == ["Sugar disease"]
    with pytest.raises(ConceptNormError, match=r"MRCONSO.RRF:5: malformed"):
        next(records)  # the last CUI is given when the next line is read, and that line is broken


def test_synthetic_mrconso_rows_load(tmp_path):
    path = tmp_path / "MRCONSO.RRF"
    write_mrconso(path, 500)
    lines = path.read_text().splitlines()
    assert len(lines) == 500 and all(len(line.split("|")) == 19 for line in lines)
    kb = load_kb(path)
    assert 100 < len(kb) < 500 and len(kb.names()) > 450
    first = lines[0].split("|")
    assert kb.concepts[first[0]].canonical_name == first[14]


# --- the vector store ----------------------------------------------------------------------------------------------
def test_float16_rows_keep_their_cosine_and_others_stay_float32():
    vectors = unit(500, 64)
    store = VectorStore(64)
    store.append(vectors)
    assert store.dtype == np.float16 and store.nbytes == 500 * 64 * 2
    back = store[np.arange(500)]
    cosines = (back * vectors).sum(1) / np.linalg.norm(back, axis=1)
    assert cosines.min() >= 0.999 and back.dtype == np.float32
    assert np.array_equal(store[7], back[7]) and np.array_equal(store[10:13], back[10:13])
    huge = np.full((1, 64), 1e5, dtype=np.float32)  # beyond float16's range
    store.append(huge)
    assert store.dtype == np.float32 and np.array_equal(store[500], huge[0])
    assert np.array_equal(store[np.arange(500)], back)  # the rows already there are unchanged


def test_a_saved_store_is_memory_mapped_copy_on_write(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_store_module, "FILE_READ_BYTES", 0)  # rows are read from the file, not the map
    store = VectorStore(16)
    store.append(unit(100))
    crc = store.save(tmp_path / "v.npy")
    assert np.array_equal(np.load(tmp_path / "v.npy"), store.raw(slice(0, 100)))  # a plain .npy
    before = (tmp_path / "v.npy").read_bytes()
    loaded = VectorStore.load(tmp_path / "v.npy", (100, 16), crc)
    assert isinstance(loaded._base, np.memmap) and np.array_equal(loaded[np.arange(100)], store[np.arange(100)])
    assert not isinstance(loaded.raw(slice(0, 50)), np.memmap) and np.array_equal(loaded[:50], store[:50])
    rows = np.array([7, 3, 4, 5, 99, 3])  # any order, runs, repeats
    assert np.array_equal(loaded[rows], store[rows]) and np.array_equal(loaded[[42]], store[[42]])
    loaded[3] = unit(1, seed=9)[0]
    loaded.append(unit(2, seed=8))
    assert (tmp_path / "v.npy").read_bytes() == before  # written rows stay in memory
    assert len(loaded) == 102 and np.allclose(loaded[3], unit(1, seed=9)[0], atol=1e-3)
    assert np.allclose(loaded[:50][3], unit(1, seed=9)[0], atol=1e-3)  # long runs too, once a row is written
    with pytest.raises(ConceptNormError, match="checksum"):
        VectorStore.load(tmp_path / "v.npy", (100, 16), crc ^ 1)
    (tmp_path / "cut.npy").write_bytes(before[: len(before) // 2])
    with pytest.raises(ConceptNormError, match=r"cut\.npy.*truncated or corrupt"):
        VectorStore.load(tmp_path / "cut.npy")
    other = VectorStore.load(tmp_path / "v.npy")
    (tmp_path / "v.npy").unlink()  # replaced by a save to the same directory: the file opened is still read
    assert np.array_equal(other[:50], store[:50])
    assert np.array_equal(pickle.loads(pickle.dumps(other))[:50], store[:50])  # pickled with its rows


@pytest.mark.parametrize("rows", [0, 5])
def test_a_store_saved_with_a_version_2_header_is_checked_from_where_its_data_start(tmp_path, rows):
    """`np.save` writes format 2.0 headers for very long ones; the crc32 covers the data after any header."""
    values = unit(rows, 16).astype(np.float16) if rows else np.zeros((0, 16), dtype=np.float16)
    with open(tmp_path / "v2.npy", "wb") as f:
        np.lib.format.write_array(f, values, version=(2, 0))
    data = values.tobytes()
    assert (tmp_path / "v2.npy").read_bytes().endswith(data) and (tmp_path / "v2.npy").read_bytes()[6] == 2
    loaded = VectorStore.load(tmp_path / "v2.npy", (rows, 16), zlib.crc32(data))
    assert len(loaded) == rows and np.array_equal(loaded.raw(slice(0, rows)), values)
    with pytest.raises(ConceptNormError, match="checksum"):
        VectorStore.load(tmp_path / "v2.npy", (rows, 16), zlib.crc32(data + b"x"))


# --- indexes on the store, and their type by size -------------------------------------------------------------------
def test_exact_indexes_search_the_store_without_a_copy():
    vectors = unit(3000, 32)
    store = VectorStore(32)
    store.append(vectors)
    standalone = VectorIndex(32)
    standalone.add(np.arange(0, 3000, 2), vectors[::2])
    queries = vectors[:40:2] + 0.01
    for index_type in ("exact", "flat"):
        shared = VectorIndex.on_store(store, index_type=index_type)
        shared.add(np.arange(0, 3000, 2))  # every other row: the rest are masked
        assert shared.nbytes() < store.nbytes / 10  # its member rows, not their vectors
        for batch in (1, 40):  # float16 rows multiplied as they are, or converted first
            found = shared.search(queries[:batch], 5)[1]
            expected = standalone.search(queries[:batch], 5)[1]  # float32: near ties may come in another order
            assert (found[:, 0] == expected[:, 0]).all() and (found % 2 == 0).all()
            assert np.mean([len(set(a) & set(b)) for a, b in zip(found, expected)]) >= 4.5


@pytest.mark.parametrize("index_type", ["hnsw", "ivf", "ivfpq"])
def test_approximate_indexes_on_a_store_give_exact_scores_and_save_to_files(index_type, tmp_path):
    vectors = unit(2000, 32)
    store = VectorStore(32)
    store.append(vectors)
    index = VectorIndex.on_store(store, index_type=index_type, ivf_nlist=8, ivf_nprobe=8, pq_m=8)
    index.add(np.arange(2000))
    scores, ids = index.search(vectors[:10], 3)
    assert ids[:, 0].tolist() == list(range(10))
    exact = (store[ids.ravel()] * np.repeat(vectors[:10], 3, axis=0)).sum(1).reshape(10, 3)
    assert np.allclose(scores, exact, atol=1e-6)  # ranked by the store's vectors, not the codes
    crc = index.write(tmp_path / "index.faiss")
    copy = VectorIndex.on_store(store, index_type=index_type, ivf_nprobe=8)
    copy.read(tmp_path / "index.faiss", [], crc)
    assert copy.search(vectors[:10], 3)[1].tolist() == ids.tolist()
    with pytest.raises(ConceptNormError, match="checksum"):
        copy.read(tmp_path / "index.faiss", [], crc ^ 1)


def test_the_index_type_follows_the_number_of_names(monkeypatch):
    """Documented: exact search up to 250,000 names, HNSW up to 1,000,000, IVF-PQ beyond."""
    assert choose_index_type(73_000) == "exact"  # MEDIC
    assert choose_index_type(250_000) == "exact"
    assert choose_index_type(250_001) == "hnsw"
    assert choose_index_type(1_000_000) == "hnsw"
    assert choose_index_type(1_000_001) == "ivfpq"
    monkeypatch.setattr(index_module, "EXACT_MAX_ROWS", 100)
    monkeypatch.setattr(index_module, "HNSW_MAX_ROWS", 200)
    store = VectorStore(16)
    store.append(unit(300))
    for rows, expected in ((50, "exact"), (150, "hnsw"), (300, "ivfpq")):
        index = VectorIndex.on_store(store, index_type="auto")
        index.add(np.arange(rows))
        assert index.index_type == expected


def test_a_searcher_keeps_the_index_type_it_chose(monkeypatch, tmp_path):
    monkeypatch.setattr(index_module, "EXACT_MAX_ROWS", 5)
    monkeypatch.setattr(index_module, "HNSW_MAX_ROWS", 10)
    kb = KnowledgeBase()
    for i in range(40):
        kb.add_concept(Concept(f"D{i}", f"disease number {i}"), [f"syndrome {i}"])
    kb.add_names([("dn 3", "D3")], DOMAIN)
    searcher = SieveSearcher(kb, TrigramEncoder(), strategy="D-T+OD-T", top_k=3)  # index_type auto
    searcher.build()
    assert {s: i.index_type for s, i in searcher.indexes.items()} == {ONTOLOGY: "ivfpq", DOMAIN: "exact"}
    assert searcher.indexes[ONTOLOGY].store is searcher.vectors is searcher.indexes[DOMAIN].store
    searcher.to_disk(tmp_path / "s")
    assert (tmp_path / "s" / "ontology.faiss").exists() and not (tmp_path / "s" / "domain.faiss").exists()
    monkeypatch.setattr(index_module, "EXACT_MAX_ROWS", 10**6)  # the saved choice is kept, not made again
    loaded = SieveSearcher(kb, searcher.encoder, "D-T+OD-T", top_k=3).from_disk(tmp_path / "s")
    assert loaded.indexes[ONTOLOGY].index_type == "ivfpq"
    assert isinstance(loaded.vectors._base, np.memmap)
    queries = ["disease number 7", "syndrome 12", "dn 3"]
    assert [m.candidates for m in loaded.search(queries)] == [m.candidates for m in searcher.search(queries)]
    assert loaded.search(["syndrome 12"])[0].candidates[0] == ("D12", pytest.approx(1.0, abs=1e-9))


def test_benchmark_queries_are_near_their_rows():
    store = VectorStore(384)
    store.append(unit(2000, 384))
    queries = make_queries(store, 50)
    best = (queries @ store[np.arange(2000)].T).max(axis=1)
    assert np.allclose(best, 0.8, atol=0.05)


# --- the lexical index over too many names ----------------------------------------------------------------------------
def test_the_lexical_index_is_off_over_its_limit():
    names = [f"name {i}" for i in range(30)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = LexicalIndex(max_names=20).fit(names)
    assert any("[W106]" in str(w.message) for w in caught)
    assert len(index) == 30
    scores = index.scores(["name 3"])
    assert all(m.shape == (1, 30) and m.nnz == 0 for m in scores.values())
    index.add(["one more"])
    copy = LexicalIndex(max_names=20).from_bytes(index.to_bytes())
    assert len(copy) == 31 and copy.scores(["x"])["tfidf"].nnz == 0  # (scikit-learn never imported)


def test_rescoring_a_few_queries_at_a_time_gives_the_same_answers(monkeypatch):
    store = VectorStore(32)
    store.append(unit(2000, 32))
    index = VectorIndex.on_store(store, index_type="hnsw")
    index.add(np.arange(2000))
    queries = unit(25, 32, seed=7)
    scores, ids = index.search(queries, 5)
    monkeypatch.setattr(index_module, "RESCORE_ROWS", 50)  # 20 rows a query (5 asked, refined 4x): 2 at a time
    assert np.array_equal(index.search(queries, 5)[1], ids)
    exact = (store[ids.ravel()] * np.repeat(queries, 5, axis=0)).sum(1).reshape(25, 5)
    assert np.allclose(index.search(queries, 5)[0], exact, atol=1e-6)
