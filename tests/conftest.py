# The package first, before spaCy loads torch: its OpenMP threads then wait passively (spacy_conceptnorm.ml.threads).
# With spinning threads, the in-process training test took 277 s instead of 28 on a loaded 2-core machine.
import spacy_conceptnorm  # noqa: F401, I001

from pathlib import Path

import pytest
import spacy
from spacy.training import Example

from spacy_conceptnorm.io.corpus import pubtator_to_docs
from spacy_conceptnorm.kb.knowledge_base import load_kb

FIXTURES = Path(__file__).parent / "fixtures"


def save_tiny_bert(path: Path, layers: int = 1) -> Path:
    """A random BERT of `layers` layers, 32 wide, with the packaged MiniLM tokenizer, saved in `path`: a real
    transformers directory that loads, trains and exports in about a second."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from spacy_conceptnorm.ml.name_encoder import packaged_model_path

    tokenizer = AutoTokenizer.from_pretrained(packaged_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """`save_tiny_bert` with one layer, made once per test module."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def kb():
    return load_kb(FIXTURES / "medic_sample.txt")


@pytest.fixture(scope="session")
def train_docs():
    return list(pubtator_to_docs(spacy.blank("en"), FIXTURES / "ncbi_train_sample.txt"))


@pytest.fixture(scope="session")
def test_docs():
    return list(pubtator_to_docs(spacy.blank("en"), FIXTURES / "ncbi_test_sample.txt"))


@pytest.fixture(scope="session")
def linker_nlp(train_docs):
    """A blank pipeline with a concept_normalizer over the MEDIC sample, train mentions as domain synonyms.
    Built once: encoding the sample KB with the real encoder takes a few seconds."""
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer")
    normalizer.initialize(
        lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt")
    )
    return nlp


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Tests on `linker_nlp` (the real encoder over the MEDIC sample: about 40 s to build) are in the slow set,
    which the default `pytest` run skips and `pytest -m slow` runs."""
    for item in items:
        if "linker_nlp" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
