# The package first, before spaCy loads torch: its OpenMP threads then wait passively (spacy_conceptnorm.threads).
# With spinning threads, the in-process training test took 277 s instead of 28 on a loaded 2-core machine.
import spacy_conceptnorm  # noqa: F401, I001

from pathlib import Path

import pytest
import spacy
from spacy.training import Example

from spacy_conceptnorm.corpus import pubtator_to_docs
from spacy_conceptnorm.kb import load_kb

FIXTURES = Path(__file__).parent / "fixtures"


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
