"""The encoder's ONNX Runtime: the same vectors as torch in fp32 (cosine >= 0.999 on every fixture name),
batch-independent query vectors, the export cached and re-made when damaged, pickling and forked workers, errors."""

import multiprocessing
import pickle
import sys

import numpy as np
import pytest
import spacy

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.ml.name_encoder import NameEncoder

from .conftest import save_tiny_bert

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

MENTIONS = ["breast cancer", "hereditary nonpolyposis colorectal cancer type 2", "a", "tumours of the mammary gland"]


@pytest.fixture(autouse=True)
def onnx_cache(tmp_path_factory, monkeypatch):
    """Exports go to a temporary cache, one per test module (not ~/.cache)."""
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "spacy_conceptnorm" / "onnx"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Two layers: the export's graph then repeats a layer."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), layers=2)


@pytest.fixture(scope="module")
def fixture_names(fixtures):
    return load_kb(fixtures / "medic_sample.txt").names()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_onnx_vectors_match_torch_fp32_on_every_fixture_name(tiny_model, fixture_names, pooling):
    torch_vectors = NameEncoder(str(tiny_model), pooling=pooling, precision="fp32").encode(fixture_names)
    encoder = NameEncoder(str(tiny_model), pooling=pooling, runtime="onnx")
    onnx_vectors = encoder.encode(fixture_names)
    assert len(fixture_names) > 300 and onnx_vectors.shape == torch_vectors.shape
    assert cosines(onnx_vectors, torch_vectors).min() >= 0.999
    assert np.allclose(np.linalg.norm(onnx_vectors, axis=1), 1.0, atol=1e-5)
    assert encoder._model is None  # the torch model was never loaded


@pytest.mark.slow
def test_packaged_model_under_onnx_matches_torch_on_every_fixture_name(fixture_names):
    torch_vectors = NameEncoder(precision="fp32").encode(fixture_names)
    onnx_vectors = NameEncoder(runtime="onnx").encode(fixture_names)
    assert cosines(onnx_vectors, torch_vectors).min() >= 0.999


def test_onnx_query_vectors_do_not_depend_on_the_batch(tiny_model):
    encoder = NameEncoder(str(tiny_model), runtime="onnx")
    together = encoder.encode_queries(MENTIONS * 3)
    alone = np.stack([encoder.encode_queries([m])[0] for m in MENTIONS])
    assert np.array_equal(together[: len(MENTIONS)], alone)


def test_the_export_is_cached_and_remade_when_damaged(tiny_model, onnx_cache, monkeypatch):
    first = NameEncoder(str(tiny_model), runtime="onnx").encode(MENTIONS)
    exports = list(onnx_cache.glob("*.onnx"))
    assert exports
    import spacy_conceptnorm.ml.onnx_export as onnx_export

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    with monkeypatch.context() as m:
        m.setattr(onnx_export, "export", no_export)
        assert np.array_equal(NameEncoder(str(tiny_model), runtime="onnx").encode(MENTIONS), first)
    for path in exports:
        path.write_bytes(path.read_bytes()[:1000])  # cut short
    assert np.allclose(NameEncoder(str(tiny_model), runtime="onnx").encode(MENTIONS), first, atol=1e-6)


def test_a_pickled_onnx_encoder_opens_its_own_session(tiny_model):
    encoder = NameEncoder(str(tiny_model), runtime="onnx")
    vectors = encoder.encode(MENTIONS)
    copy = pickle.loads(pickle.dumps(encoder))
    assert encoder.loaded and not copy.loaded
    assert np.array_equal(copy.encode(MENTIONS), vectors)


ENCODER = None


def _encode_in_child(texts):
    return ENCODER.encode(texts)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="fork start method needed")
def test_a_forked_worker_encodes_with_its_own_session(tiny_model):
    global ENCODER
    ENCODER = NameEncoder(str(tiny_model), runtime="onnx")
    vectors = ENCODER.encode(MENTIONS)  # the parent's session and its threads exist before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply_async(_encode_in_child, (MENTIONS,)).get(timeout=120)
    assert np.allclose(child, vectors, atol=1e-6)


def test_a_pipeline_keeps_its_configured_runtime_when_saved_and_loaded(tiny_model, tmp_path):
    from spacy_conceptnorm.kb.knowledge_base import Concept, KnowledgeBase

    kb = KnowledgeBase.from_records([(Concept("A", "liver disease"), ["hepatopathy"]), (Concept("B", "anemia"), [])])
    nlp = spacy.blank("en")
    config = {"encoder": {"model": str(tiny_model), "runtime": "onnx"}, "ranker": None}
    nlp.add_pipe("concept_normalizer", config=config).initialize(nlp=nlp, kb=kb)
    nlp.to_disk(tmp_path / "pipeline")
    encoder = spacy.load(tmp_path / "pipeline").get_pipe("concept_normalizer").encoder
    assert encoder.runtime == "onnx" and not encoder.loaded
    assert cosines(encoder.encode(["hepatopathy"]), NameEncoder(str(tiny_model)).encode(["hepatopathy"]))[0] > 0.999


def test_auto_runtime_is_onnx_runtime_where_installed_for_fp32_on_the_cpu(tiny_model, monkeypatch):
    import importlib.util

    def runtime(**kw):
        return NameEncoder(str(tiny_model), runtime="auto", **kw).runtime

    assert runtime(device="cpu", precision="fp32") == "onnx"
    assert runtime(device="cpu", precision="bf16") == "torch"  # ONNX Runtime computes in fp32 only
    assert runtime(device="cuda", precision="fp32") == "torch"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else find_spec(name, *a))
    assert runtime(device="cpu", precision="fp32") == "torch"  # no exporter: torch


def test_runtime_errors(tiny_model, monkeypatch):
    with pytest.raises(ConceptNormError, match="E130"):
        NameEncoder(runtime="tensorrt")
    with pytest.raises(ConceptNormError, match="E132"):
        NameEncoder(runtime="onnx", precision="bf16")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(ConceptNormError, match=r"E131.*spacy-conceptnorm\[onnx\]"):
        NameEncoder(str(tiny_model), runtime="onnx").encode(["anemia"])
