import numpy as np
import pytest

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.search.index import VectorIndex


def unit(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("index_type", ["exact", "flat", "hnsw", "ivf"])
def test_search_add_remove_and_reload(index_type):
    vectors = unit(400)
    ids = np.arange(1000, 1400)
    index = VectorIndex(16, index_type=index_type, ivf_nlist=4, ivf_nprobe=4)
    index.add(ids, vectors)
    scores, found = index.search(vectors[:5], 3)
    assert found[:, 0].tolist() == ids[:5].tolist()  # each vector is its own nearest neighbour
    assert np.allclose(scores[:, 0], 1.0, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first

    index.remove(ids[:2])
    assert len(index) == 398
    _, found = index.search(vectors[:2], 3)
    assert not set(found.ravel()) & {1000, 1001}

    # reloaded as the searcher does: exact and flat indexes are rebuilt from the vectors of the ids they hold
    copy = VectorIndex(16, index_type=index_type, ivf_nlist=4, ivf_nprobe=4)
    data = index.to_bytes()
    if index_type in ("exact", "flat"):
        assert data == b""
        copy.add(ids[2:], vectors[2:])
    else:
        assert data
        copy.load_bytes(data, index.removed)
    assert len(copy) == len(index) == 398
    queries = vectors[:7]  # two removed ids among them
    (want_scores, want_ids), (got_scores, got_ids) = index.search(queries, 3), copy.search(queries, 3)
    assert got_ids.tolist() == want_ids.tolist() and np.allclose(got_scores, want_scores, atol=1e-6)
    assert not set(got_ids.ravel()) & {1000, 1001} and got_ids[2:, 0].tolist() == ids[2:7].tolist()


def test_empty_index_and_padding():
    index = VectorIndex(8)
    scores, ids = index.search(unit(2, 8), 4)
    assert ids.shape == (2, 4) and (ids == -1).all() and np.isneginf(scores).all()
    index.add(np.array([7]), unit(1, 8))
    scores, ids = index.search(unit(1, 8), 3)
    assert ids.tolist() == [[7, -1, -1]]


def test_bad_arguments():
    with pytest.raises(ConceptNormError, match="Unknown index type"):
        VectorIndex(8, index_type="annoy")
    with pytest.raises(ConceptNormError, match="dimension mismatch"):
        VectorIndex(8).add(np.array([1]), unit(1, 4))
