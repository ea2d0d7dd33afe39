"""The `benchmark speed`, `benchmark throughput` and `benchmark weight` commands run on small saved pipelines and
print the lines they promise (no timings are asserted: speed is measured by the commands, not by tests), and the
public hooks the repo-root benchmarks use."""

import re
from pathlib import Path

import numpy as np
import pytest
import spacy
import srsly
from spacy.tokens import DocBin
from spacy.training import Example
from spacy.util import load_config, load_model_from_config
from typer.testing import CliRunner

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.cli.benchmark_speed import SPACY_SHARE, TfidfLinker
from spacy_conceptnorm.io.corpus import pubtator_to_docs, read_pubtator
from spacy_conceptnorm.kb.knowledge_base import load_kb

REPO = Path(__file__).parents[1]
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


@pytest.fixture(scope="module")
def trf_saved(tiny_bert, fixtures, tmp_path_factory):
    """configs/ner_trf.cfg on the tiny BERT (windows of 24 words), initialized on two train abstracts and saved
    twice: "trained", transformer -> ner in fp32, and "sourced", the ner with its own copy of the transformer as
    `assemble` sources it, in bf16."""
    root = tmp_path_factory.mktemp("trf")
    for form, precision in (("trained", "fp32"), ("sourced", "bf16")):
        overrides = {"paths.transformer": str(tiny_bert), "components.transformer.model.cpu_precision": precision,
                     "components.transformer.model.get_spans.window": 24,
                     "components.transformer.model.get_spans.stride": 20,
                     "components.transformer.model.predict_spans.window": 24,
                     "components.transformer.model.predict_spans.stride": 22}  # fmt: skip
        config = load_config(REPO / "configs" / "ner_trf.cfg", overrides=overrides, interpolate=True)
        nlp = load_model_from_config(config, auto_fill=True)
        train = list(pubtator_to_docs(nlp, fixtures / "ncbi_train_sample.txt"))[:2]
        nlp.initialize(lambda train=train, nlp=nlp: [Example(nlp.make_doc(d.text), d) for d in train])
        if form == "sourced":
            nlp.replace_listeners("transformer", "ner", ["model.tok2vec"])
            nlp.remove_pipe("transformer")
        nlp.to_disk(root / form)
    return root


def speed(*args: str) -> list[str]:
    return benchmark("speed", *args)


def benchmark(command: str, *args: str) -> list[str]:
    result = CliRunner().invoke(app, ["benchmark", command, *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()


def components(lines: list[str]) -> dict[str, float]:
    """The rows of `benchmark throughput`'s table: seconds by component."""
    start = lines.index("| component | seconds | share |")
    assert lines[start + 1] == "|---|---|---|"
    rows = [line.strip("| ").split(" | ") for line in lines[start + 2 :] if line.startswith("| ")]
    return {name: float(seconds) for name, seconds, _ in rows}


@pytest.mark.parametrize("dense", [True, False])
def test_tfidf_links_each_text_to_its_nearest_name(dense):
    names = ["liver disease", "anemia", "breast cancer", "cystic fibrosis"]
    linker = TfidfLinker(names, batch=2)
    found = linker.link(["liver diseases", "anaemia", "cancer of the breast", "fibrosis, cystic", "Anemia"], dense)
    assert found == ["liver disease", "anemia", "breast cancer", "cystic fibrosis", "anemia"]


def test_speed_prints_the_split_and_the_ratio_last(saved):
    test = saved.parent.parent / "corpus" / "test.spacy"
    lines = speed(saved, test, "--passes", "1")
    assert re.fullmatch(r"ratio \d+\.\d\d", lines[-1])
    assert re.search(r"4 docs, \d+ gold mentions", lines[0])  # the 4 abstracts of corpus/test.spacy
    for part in ("encoding", "index search", "abbreviation_resolver", "composite_splitter", "concept_normalizer"):
        assert any(line.startswith(f"| {part}") for line in lines), part
    assert not any("docs/s" in line for line in lines)  # `benchmark throughput`'s
    floor = (
        r"encoding [1-9]\d* texts \([\d,]+ word pieces\): \d+\.\d{3} s; floor .* \d+\.\d{3} s; encoding/floor \d+\.\d\d"
    )
    assert any(re.fullmatch(floor, line) for line in lines)
    sparse = r"\(with scikit-learn's sparse argmax: [\d,]+, ratio \d+\.\d\d\)"
    assert re.fullmatch(rf"pipeline: [\d,]+ mentions/s; TF-IDF .*: [\d,]+ mentions/s {sparse}", lines[-2])


def test_speed_links_the_annotations_of_a_pubtator_file(saved, fixtures):
    lines = speed(saved, fixtures / "ncbi_test_sample.txt", "--passes", "1")  # its annotations are the mentions
    assert re.search(r"4 docs, \d+ gold mentions", lines[0])
    assert re.fullmatch(r"ratio \d+\.\d\d", lines[-1])


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_speed_over_documents_without_entities_times_what_the_recognizers_find(saved, fixtures, tmp_path, suffix):
    texts = [doc.text.replace("\n", " ") for doc in read_pubtator(fixtures / "ncbi_test_sample.txt")]
    data = tmp_path / f"docs{suffix}"
    if suffix == ".jsonl":
        srsly.write_jsonl(data, [{"id": i, "text": text} for i, text in enumerate(texts)])
    else:
        data.write_text("\n".join(texts) + "\n", encoding="utf-8")
    lines = speed(saved, data, "--passes", "1")
    assert re.search(r"4 docs, [1-9]\d* recognized mentions", lines[0])  # the dictionary matcher finds MEDIC names
    assert re.fullmatch(r"ratio \d+\.\d\d", lines[-1])


def test_speed_refuses_a_pipeline_without_a_concept_normalizer(tmp_path, fixtures):
    spacy.blank("en").to_disk(tmp_path / "blank")
    args = ["benchmark", "speed", str(tmp_path / "blank"), str(fixtures / "ncbi_test_sample.txt")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "no concept_normalizer" in result.output


def test_throughput_prints_docs_chars_and_each_components_share_and_no_floor_without_a_transformer(saved, tmp_path):
    notes = (REPO / "docs" / "clinical_notes" / "whole" / "dev.jsonl").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "notes.jsonl"  # whole notes, {"note", "text", "spans"} a line: no "id"
    data.write_text("\n".join(notes[:2]) + "\n", encoding="utf-8")
    lines = benchmark("throughput", saved, data, "--passes", "1", "--output", tmp_path / "figures.json")
    assert lines[-1] == "floor: none (the pipeline has no transformer)"
    assert re.search(r": 2 docs, [\d,]+ characters; 1 pass, batch size \d+, 1 process; ", lines[0])
    docs_per_second = r"\d+\.\d docs/s, [\d,]+ chars/s \(\d+\.\d{3} s a pass, median\)"
    assert any(re.fullmatch(rf"pipeline \(ner -> .* -> link_filter, cache off\): {docs_per_second}", x) for x in lines)
    rows = components(lines)
    assert list(rows) == ["tokenizer", *PIPES, SPACY_SHARE]  # spaCy's ner, which cannot be wrapped, has its row
    total = float(re.search(r"instrumented pass \((\d+\.\d{3}) s, one process\)", "\n".join(lines)).group(1))
    assert sum(rows.values()) == pytest.approx(total, abs=0.0005 * (len(rows) + 1))
    figures = srsly.read_json(tmp_path / "figures.json")
    assert (figures["docs"], figures["floor"], "ratio" in figures) == (2, None, False)
    assert figures["characters"] == sum(len(srsly.json_loads(note)["text"]) for note in notes[:2])
    assert sum(figures["split_seconds"].values()) == pytest.approx(figures["split_total_seconds"])


@pytest.mark.parametrize(
    "form,pipes,precision", [("trained", ["transformer", "ner"], "fp32"), ("sourced", ["ner"], "bf16")]
)
def test_throughput_runs_the_floor_of_the_recognizers_transformer_and_prints_the_ratio_last(
    trf_saved, fixtures, tmp_path, form, pipes, precision
):
    args = ["--passes", "2", "--batch-size", "2", "--output", tmp_path / "figures.json"]
    lines = benchmark("throughput", trf_saved / form, fixtures / "ncbi_test_sample.txt", *args)
    assert re.fullmatch(r"ratio \d+\.\d\d", lines[-1])
    floor = re.fullmatch(
        rf"floor: forward passes of the transformer in {pipes[0]} \({precision}; ([\d,]+) word pieces in "
        r"([\d,]+) windows of up to 24\): \d+\.\d{3} s, \d+\.\d docs/s",
        lines[-2],
    )
    assert floor, lines[-2]
    pieces, windows = (int(group.replace(",", "")) for group in floor.groups())
    assert windows * 22 >= pieces > (windows - 4) * 22  # 22 pieces a window but the last of each of the 4 abstracts
    assert re.search(r": 4 docs, [\d,]+ characters; 2 passes, batch size 2, 1 process; ", lines[0])
    assert list(components(lines)) == ["tokenizer", *pipes, SPACY_SHARE]
    figures = srsly.read_json(tmp_path / "figures.json")
    assert figures["floor"]["seconds"] > 0 and figures["floor"]["precisions"] == [precision]
    ratios = [run["pipeline_seconds"] / run["floor_seconds"] for run in figures["passes"]]
    assert min(ratios) <= figures["ratio"] <= max(ratios)  # the ratio of a pass: each runs both, one after the other


def test_throughput_refuses_a_missing_pipeline_and_data_without_text(saved, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"note": "a", "spans": []}\n', encoding="utf-8")
    for args, message in (
        ([tmp_path / "nowhere", empty], "Error: "),
        ([saved, empty], f"Error: no documents in {empty}"),
    ):
        result = CliRunner().invoke(app, ["benchmark", "throughput", *map(str, args)])
        assert result.exit_code == 1
        assert message in result.output


def test_weight_refuses_a_mention_missing_from_its_text(saved):
    result = CliRunner().invoke(app, ["benchmark", "weight", str(saved), "--text", "No disease here.",
                                      "--mention", "breast cancer"])  # fmt: skip
    assert result.exit_code == 2
    assert "--mention" in result.output


@pytest.mark.slow  # 4 fresh processes, each importing every installed spaCy entry point (spacy-transformers: seconds)
def test_weight_prints_the_floor_each_component_and_above_floor_last(saved):
    result = CliRunner().invoke(app, ["benchmark", "weight", str(saved), "--runs", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert re.fullmatch(r"above floor: [+-]\d+\.\d\d s, [+-]\d+ MB", lines[-1])
    assert re.fullmatch(r"linker alone above floor: [+-]\d+\.\d\d s, [+-]\d+ MB", lines[-2])
    for row in ('spacy.blank("en")', "recognizer alone", "linker alone", "whole pipeline", *PIPES):
        assert any(line.startswith(f"| {row} |") for line in lines), row
    # the linker alone links the marked mentions, known names without the encoder, then opens it
    assert any(line.startswith("linker alone, first unseen mention (the encoder opens): +") for line in lines)
    assert re.search(r"saved pipeline on disk: \d+\.\d MB", result.output)


def test_the_benchmark_group_lists_speed_throughput_and_weight():
    result = CliRunner().invoke(app, ["benchmark", "--help"])
    assert result.exit_code == 0, result.output
    assert all(command in result.output for command in ("speed", "throughput", "weight"))


# --- the public hooks of the repo-root benchmarks -----------------------------------------------------------------


def test_a_built_ivf_index_searches_wider_without_a_rebuild():
    from spacy_conceptnorm.search.index import VectorIndex

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((400, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:40] + 0.5 * rng.standard_normal((40, 8)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :3]
    index = VectorIndex(8, index_type="ivf", ivf_nlist=8, ivf_nprobe=1)
    index.add(np.arange(400), vectors)
    assert (index.search(queries, 3)[1] != exact).any()  # one list of eight: some neighbours missed
    index.set_search_breadth(ivf_nprobe=8)
    assert index.nprobe == 8 and index.config()["ivf_nprobe"] == 8
    assert (index.search(queries, 3)[1] == exact).all()  # every list: exact


def test_a_built_hnsw_index_takes_a_new_search_breadth():
    import faiss

    from spacy_conceptnorm.search.index import VectorIndex

    vectors = np.eye(8, dtype=np.float32)
    index = VectorIndex(8, index_type="hnsw")
    index.add(np.arange(8), vectors)
    index.set_search_breadth(hnsw_ef_search=256)
    assert index.config()["hnsw_ef_search"] == 256
    assert faiss.downcast_index(index._index.index).hnsw.efSearch == 256
    assert index.search(vectors, 1)[1].ravel().tolist() == list(range(8))


def test_an_encoder_encodes_with_the_model_it_is_given(tiny_bert):
    import copy

    from spacy_conceptnorm.ml.name_encoder import NameEncoder

    encoder = NameEncoder(str(tiny_bert), precision="fp32")
    reference = encoder.encode(["breast cancer", "anemia"])
    other = copy.deepcopy(encoder.model)
    encoder.model = other
    assert encoder.model is other
    assert np.allclose(encoder.encode(["breast cancer", "anemia"]), reference, atol=1e-6)
    fresh = NameEncoder(str(tiny_bert), precision="fp32")
    fresh.model = other  # before first use: the weights are not loaded over it
    assert fresh.model is other
    assert np.allclose(fresh.encode(["breast cancer", "anemia"]), reference, atol=1e-6)


def test_set_spinning_turns_the_one_thread_fallback_off(monkeypatch):
    import torch

    from spacy_conceptnorm.ml import threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "cpu_budget", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    try:
        for spinning, inside in ((True, 1), (False, 2)):
            threads.set_spinning(spinning)
            with threads.one_thread_if_oversubscribed():
                assert torch.get_num_threads() == inside
    finally:
        monkeypatch.undo()
        threads.passive_openmp_by_default()
        torch.set_num_threads(before)
