"""The speed and weight benchmarks run on a small saved pipeline and print the lines they promise (no timings are
asserted: speed is measured by the commands, not by tests)."""

import re

import pytest
import spacy
from spacy.tokens import DocBin
from spacy.training import Example
from typer.testing import CliRunner

from benchmarks import speed, weight
from spacy_conceptnorm.io.corpus import pubtator_to_docs
from spacy_conceptnorm.kb.knowledge_base import load_kb

PIPES = ["ner", "dictionary_matcher", "abbreviation_resolver", "composite_splitter", "concept_normalizer",
         "link_filter"]  # fmt: skip


@pytest.fixture(scope="module")
def saved(tiny_bert, fixtures, tmp_path_factory):
    """A project-like folder: training/pipeline (a small untrained recognizer, the linker on the MEDIC sample
    with the tiny encoder) and corpus/test.spacy beside it."""
    root = tmp_path_factory.mktemp("project")
    nlp = spacy.blank("en")
    train = list(pubtator_to_docs(nlp, fixtures / "ncbi_train_sample.txt"))
    kb = load_kb(fixtures / "medic_sample.txt")
    ner = nlp.add_pipe("ner")
    ner.add_label("Disease")
    ner.initialize(lambda: [Example(nlp.make_doc(d.text), d) for d in train[:2]], nlp=nlp)
    nlp.add_pipe("dictionary_matcher").initialize(lambda: [], kb=kb)
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("composite_splitter")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": {"model": str(tiny_bert)}, "ranker": None})
    normalizer.initialize(lambda: [Example(d, d) for d in train], nlp=nlp, kb=kb)
    nlp.add_pipe("link_filter")
    (root / "training").mkdir()
    nlp.to_disk(root / "training" / "pipeline")
    (root / "corpus").mkdir()
    DocBin(docs=pubtator_to_docs(nlp, fixtures / "ncbi_test_sample.txt")).to_disk(root / "corpus" / "test.spacy")
    return root / "training" / "pipeline"


@pytest.mark.parametrize("dense", [True, False])
def test_tfidf_links_each_text_to_its_nearest_name(dense):
    names = ["liver disease", "anemia", "breast cancer", "cystic fibrosis"]
    linker = speed.TfidfLinker(names, batch=2)
    found = linker.link(["liver diseases", "anaemia", "cancer of the breast", "fibrosis, cystic", "Anemia"], dense)
    assert found == ["liver disease", "anemia", "breast cancer", "cystic fibrosis", "anemia"]


def test_speed_prints_the_split_end_to_end_and_the_ratio_last(saved):
    result = CliRunner().invoke(speed.app, [str(saved), "--passes", "1", "--end-to-end-passes", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert re.fullmatch(r"ratio \d+\.\d\d", lines[-1])
    assert re.search(r"4 test docs, \d+ gold mentions", lines[0])  # the 4 abstracts of corpus/test.spacy
    for part in ("encoding", "index search", "abbreviation_resolver", "composite_splitter", "concept_normalizer"):
        assert any(line.startswith(f"| {part}") for line in lines), part
    assert any(re.fullmatch(r"end to end \(ner -> .* -> link_filter, cache off\): \d+\.\d docs/s", x) for x in lines)
    sparse = r"\(with scikit-learn's sparse argmax: [\d,]+, ratio \d+\.\d\d\)"
    assert re.fullmatch(rf"pipeline: [\d,]+ mentions/s; TF-IDF .*: [\d,]+ mentions/s {sparse}", lines[-2])


def test_speed_gives_the_cost_of_the_components_left_out(saved):
    args = [str(saved), "--passes", "1", "--end-to-end-passes", "1", "--without", "composite_splitter"]
    result = CliRunner().invoke(speed.app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert any(re.fullmatch(r"without composite_splitter: \d+\.\d docs/s \(their cost: -?\d+%\)", x) for x in lines)


@pytest.mark.slow  # 4 fresh processes, each importing every installed spaCy entry point (spacy-transformers: seconds)
def test_weight_prints_the_floor_each_component_and_above_floor_last(saved):
    result = CliRunner().invoke(weight.app, [str(saved), "--runs", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert re.fullmatch(r"above floor: [+-]\d+\.\d\d s, [+-]\d+ MB", lines[-1])
    assert re.fullmatch(r"linker alone above floor: [+-]\d+\.\d\d s, [+-]\d+ MB", lines[-2])
    for row in ('spacy.blank("en")', "recognizer alone", "linker alone", "whole pipeline", *PIPES):
        assert any(line.startswith(f"| {row} |") for line in lines), row
    # the linker alone links the marked mentions, known names without the encoder, then opens it
    assert any(line.startswith("linker alone, first unseen mention (the encoder opens): +") for line in lines)
    assert re.search(r"saved pipeline on disk: \d+\.\d MB", result.output)
