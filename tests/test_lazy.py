"""A lighter single machine: the encoder's weights load only when an unseen mention needs them, once
whatever the threads, and a cache of linked mention texts across batches. A 1-layer random BERT keeps it fast."""

import multiprocessing
import pickle
import threading

import pytest
import spacy

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import Concept, KnowledgeBase
from spacy_conceptnorm.ml.name_encoder import NameEncoder

KNOWN = ["hemochromatosis", "iron storage disorder", "liver disease"]
UNSEEN = ["disorder of iron storage in the liver", "hepatic iron overload"]


def small_kb() -> KnowledgeBase:
    return KnowledgeBase.from_records([
        (Concept("A", "hemochromatosis"), ["hh", "iron storage disorder"]),
        (Concept("B", "hypogonadotropic hypogonadism"), ["hh", "gonadotropin deficiency"]),
        (Concept("C", "liver disease"), ["hepatopathy"]),
    ])  # fmt: skip


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory):
    """A saved blank pipeline with a concept_normalizer (the tiny encoder, the sieve alone) over `small_kb`."""
    nlp = spacy.blank("en")
    config = {"encoder": {"model": str(tiny_bert)}, "ranker": None, "nil_threshold": 0.0}
    nlp.add_pipe("concept_normalizer", config=config).initialize(nlp=nlp, kb=small_kb())
    path = tmp_path_factory.mktemp("pipeline")
    nlp.to_disk(path)
    return path


def docs_with(nlp, mentions):
    """One doc per mention, the whole mention marked as an entity (the pipeline has no recognizer)."""
    docs = []
    for mention in mentions:
        doc = nlp.make_doc(f"Seen with {mention} today.")
        doc.ents = [doc.char_span(10, 10 + len(mention), label="Disease")]
        docs.append(doc)
    return docs


def links(nlp, mentions, **pipe):
    """Per doc, its entities' (kb_id_, kb_ents) (as tuples: docs from worker processes come back with lists)."""
    docs = nlp.pipe(docs_with(nlp, mentions), **pipe)
    return [[(e.kb_id_, [tuple(c) for c in e._.kb_ents]) for e in doc.ents] for doc in docs]


def test_known_names_leave_the_encoder_unloaded(saved):
    nlp = spacy.load(saved)
    encoder = nlp.get_pipe("concept_normalizer").encoder
    assert not encoder.loaded  # loading the pipeline reads the saved vectors only
    found = links(nlp, KNOWN)
    assert [doc[0][0] for doc in found] == ["A", "A", "C"]
    assert not encoder.loaded
    links(nlp, UNSEEN[:1])
    assert encoder.loaded


def test_lazy_and_eager_encoders_link_alike(saved):
    lazy, eager = spacy.load(saved), spacy.load(saved)
    assert eager.get_pipe("concept_normalizer").encoder.model is not None  # loads the weights now
    mentions = KNOWN + UNSEEN + KNOWN[:1]
    assert links(lazy, mentions) == links(eager, mentions)


def test_first_encodes_from_two_threads_load_the_weights_once(tiny_bert, monkeypatch):
    import transformers

    calls = []
    load = transformers.AutoModel.from_pretrained

    def slow_load(*args, **kwargs):
        calls.append(args)
        threading.Event().wait(0.2)  # widen the window in which a second thread could start its own load
        return load(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", slow_load)
    encoder = NameEncoder(str(tiny_bert))
    results = [None, None]

    def encode(i):
        results[i] = encoder.encode(UNSEEN)

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(calls) == 1
    assert (results[0] == results[1]).all()


def test_saving_a_pipeline_whose_encoder_never_loaded_writes_the_encoder(saved, tmp_path):
    nlp = spacy.load(saved)
    assert not nlp.get_pipe("concept_normalizer").encoder.loaded
    nlp.to_disk(tmp_path / "again")
    assert (tmp_path / "again" / "concept_normalizer" / "encoder" / "config.json").exists()
    again = spacy.load(tmp_path / "again")
    mentions = KNOWN + UNSEEN
    assert links(again, mentions) == links(spacy.load(saved), mentions)


def test_a_pickled_unloaded_pipeline_loads_its_encoder_when_needed(saved):
    nlp = pickle.loads(pickle.dumps(spacy.load(saved)))
    encoder = nlp.get_pipe("concept_normalizer").encoder
    assert not encoder.loaded
    assert links(nlp, KNOWN + UNSEEN) == links(spacy.load(saved), KNOWN + UNSEEN)
    assert encoder.loaded


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="fork start method needed")
def test_forked_workers_of_an_unloaded_pipeline_link_alike(saved):
    nlp = spacy.load(saved)
    mentions = (KNOWN + UNSEEN) * 2
    expected = links(spacy.load(saved), mentions)
    assert links(nlp, mentions, n_process=2, batch_size=2) == expected
    assert not nlp.get_pipe("concept_normalizer").encoder.loaded  # the workers loaded it, not the parent


# --- the cache of linked mention texts ---------------------------------------------------------------------------
def test_cached_answers_are_the_answers(saved):
    cached = spacy.load(saved)
    uncached = spacy.load(saved, config={"components": {"concept_normalizer": {"cache_size": 0}}})
    normalizer = cached.get_pipe("concept_normalizer")
    mentions = KNOWN + UNSEEN
    first = links(cached, mentions)
    assert normalizer.cache_info()["hits"] == 0 and normalizer.cache_info()["size"] == len(mentions)
    assert links(cached, mentions) == first == links(uncached, mentions)
    assert normalizer.cache_info()["hits"] == len(mentions)
    assert uncached.get_pipe("concept_normalizer").cache_info()["hits"] == 0


def test_add_synonyms_and_set_strategy_empty_the_cache(saved):
    nlp = spacy.load(saved)
    normalizer = nlp.get_pipe("concept_normalizer")
    before = links(nlp, ["hepatic iron overload"])[0][0][0]
    other = next(cid for cid in "ABC" if cid != before)
    normalizer.add_synonyms([("hepatic iron overload", other)])
    assert links(nlp, ["hepatic iron overload"])[0][0][0] == other  # not the cached answer
    assert normalizer.cache_info()["hits"] == 0
    normalizer.remove_synonyms([("hepatic iron overload", other)])
    assert links(nlp, ["hepatic iron overload"])[0][0][0] == before
    hits = normalizer.cache_info()["hits"]
    normalizer.set_strategy("O-T", threshold=0.5)
    links(nlp, ["hepatic iron overload"])
    assert normalizer.cache_info()["hits"] == hits


def test_cache_size_bounds_the_cache(saved):
    nlp = spacy.load(saved, config={"components": {"concept_normalizer": {"cache_size": 2}}})
    normalizer = nlp.get_pipe("concept_normalizer")
    links(nlp, KNOWN + UNSEEN)
    assert normalizer.cache_info()["size"] == 2 and normalizer.cache_info()["max_size"] == 2
    normalizer.cache_size = 1
    assert normalizer.cache_info()["size"] == 1
    with pytest.raises(ConceptNormError, match="E304.*cache_size"):
        normalizer.cache_size = -1
    with pytest.raises(ConceptNormError, match="E304.*cache_size"):
        spacy.load(saved, config={"components": {"concept_normalizer": {"cache_size": -1}}})


# --- what importing costs ----------------------------------------------------------------------------------------
def fresh(code: str) -> list[str]:
    """The lines a fresh interpreter prints running `code` (this checkout's package first on its path)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


HEAVY = ("spacy", "torch", "transformers", "faiss", "sklearn", "matplotlib", "ray", "scipy")


def test_importing_the_package_loads_nothing_heavy_until_a_name_is_read():
    found = fresh(
        "import sys, spacy_conceptnorm as p\n"
        f"print(*[m for m in {HEAVY!r} if m in sys.modules] or ['none'])\n"
        "print(p.ConceptNormalizer.__module__, p.load.__module__, 'load_kb' in dir(p))"
    )
    assert found == ["none", "spacy_conceptnorm.pipeline.concept_normalizer", "spacy_conceptnorm.io.pipelines", "True"]


def test_spacys_registry_finds_every_component_and_their_modules_import_no_training_library():
    found = fresh(
        "import sys, spacy\n"
        "from spacy.util import registry\n"
        "from spacy_conceptnorm.pipeline import concept_normalizer, dictionary_matcher, link_filter\n"
        "from spacy_conceptnorm.pipeline import abbreviation_resolver, composite_splitter\n"
        "print(*[m for m in ('transformers', 'sklearn', 'matplotlib', 'ray') if m in sys.modules] or ['none'])\n"
        "nlp = spacy.blank('en')\n"
        "for name in ('abbreviation_resolver', 'composite_splitter', 'concept_normalizer', 'dictionary_matcher',"
        " 'link_filter'):\n"
        "    print(type(nlp.add_pipe(name)).__module__)\n"
        "print(registry.misc.get('spacy_conceptnorm.NameEncoder.v1').__name__)"
    )
    assert found == [
        "none", "spacy_conceptnorm.pipeline.abbreviation_resolver", "spacy_conceptnorm.pipeline.composite_splitter",
        "spacy_conceptnorm.pipeline.concept_normalizer", "spacy_conceptnorm.pipeline.dictionary_matcher",
        "spacy_conceptnorm.pipeline.link_filter",
        "NameEncoder",
    ]  # fmt: skip
