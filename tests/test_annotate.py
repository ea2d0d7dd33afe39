"""The `annotate` batch command: readers, writers, resume, bad input, n_process, the CLI."""

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import spacy
from bioc import pubtator
from spacy.language import Language
from spacy.util import registry
from typer.testing import CliRunner

from spacy_conceptnorm.annotate import annotate, pubtator_record, read_done_ids, split_text
from spacy_conceptnorm.annotate import read_pubtator as read_pubtator_input
from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.io.corpus import read_pubtator
from spacy_conceptnorm.kb.knowledge_base import load_kb

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

DOCS = [
    ("d1", "Familial breast cancer and phenylketonuria were seen."),
    ("d2", "Carriers of breast and ovarian cancer risk alleles."),
    ("d3", ""),
    ("d4", "No disease is named here."),
    ("d5", "Hemochromatosis\nwith Mitral Valve Prolapse."),
    ("d6", "Ünïcode — breast cancer again."),
]
PATTERNS = [
    "breast cancer",
    "ovarian cancer",
    "breast and ovarian cancer",
    "phenylketonuria",
    "hemochromatosis",
    "mitral valve prolapse",
]


class SavedTrigramEncoder(TrigramEncoder):
    def config(self) -> dict:
        return {}  # nothing to save: the loaded pipeline makes its encoder from the config below


@registry.misc("test_annotate.trigram_encoder.v1")
def make_trigram_encoder() -> TrigramEncoder:
    return SavedTrigramEncoder()


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory, test_docs) -> Path:
    """entity_ruler + composite_splitter + concept_normalizer over the MEDIC sample, with the trigram encoder."""
    nlp = spacy.blank("en")
    gold_mentions = sorted({e.text for d in test_docs for e in d.ents})  # so the NCBI sample has entities too
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in PATTERNS + gold_mentions])
    nlp.add_pipe("composite_splitter")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": {"@misc": "test_annotate.trigram_encoder.v1"}})
    normalizer.initialize(nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt"))
    path = tmp_path_factory.mktemp("annotate") / "pipeline"
    nlp.to_disk(path)
    return path


@pytest.fixture(scope="module")
def kb():
    return load_kb(FIXTURES / "medic_sample.txt")


def write_jsonl(path: Path, docs=DOCS) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_jsonl_to_jsonl(pipeline_dir, tmp_path, kb):
    out = tmp_path / "out.jsonl"
    summary = annotate(pipeline_dir, write_jsonl(tmp_path / "in.jsonl"), out, include_text=True, progress=False)
    records = read_jsonl(out)
    assert [r["id"] for r in records] == [i for i, _ in DOCS]
    assert [r["text"] for r in records] == [t for _, t in DOCS]
    by_id = {r["id"]: r for r in records}
    for record in records:
        for ent in record["entities"]:
            assert record["text"][ent["start"] : ent["end"]] == ent["text"]
            assert all(part in kb for part in ent["concept_id"].split("|"))
            assert 0 < ent["score"] <= 1.0001 and ent["name"] and ent["stage"]
    assert [(e["text"], e["concept_id"]) for e in by_id["d1"]["entities"]] == [
        ("breast cancer", "D001943"),
        ("phenylketonuria", "D010661"),
    ]
    (composite,) = by_id["d2"]["entities"]
    assert composite["concept_id"] == "D001943|D010051" and composite["stage"].count("|") == 1
    assert [(p["text"], p["concept_id"]) for p in composite["parts"]] == [
        ("breast cancer", "D001943"),
        ("ovarian cancer", "D010051"),
    ]
    assert composite["score"] == min(p["score"] for p in composite["parts"])
    assert composite["confidence"] == min(p["confidence"] for p in composite["parts"])
    assert all(0 <= e["confidence"] <= 1 for r in records for e in r["entities"])
    assert "parts" not in by_id["d1"]["entities"][0]
    assert by_id["d3"]["entities"] == [] and by_id["d4"]["entities"] == []  # empty text, no mention
    assert [e["text"] for e in by_id["d5"]["entities"]] == ["Hemochromatosis", "Mitral Valve Prolapse"]
    assert by_id["d6"]["entities"][0]["start"] == len("Ünïcode — ")
    assert (summary.written, summary.skipped, summary.malformed, summary.entities) == (6, 0, 0, 6)
    annotate(pipeline_dir, tmp_path / "in.jsonl", tmp_path / "lean.jsonl", progress=False)
    assert "text" not in read_jsonl(tmp_path / "lean.jsonl")[0]


def test_pubtator_input_and_output(pipeline_dir, tmp_path, kb):
    source = FIXTURES / "ncbi_test_sample.txt"  # PubTator content in a .txt file: detected as PubTator
    gold = list(read_pubtator(source))
    annotate(pipeline_dir, source, tmp_path / "out.jsonl", include_text=True, progress=False)
    records = read_jsonl(tmp_path / "out.jsonl")
    # one PubTator reader: lines as written (bioc's own strips them, which would move the abstract's offsets
    # after a title ending in a space)
    assert [(r["id"], r["text"]) for r in records] == [(d.pmid, d.text) for d in gold]
    assert records[0]["text"].endswith("genes. ")
    assert sum(len(r["entities"]) for r in records) > 20

    annotate(pipeline_dir, source, tmp_path / "out.pubtator", progress=False)
    written = list(read_pubtator(tmp_path / "out.pubtator"))  # checks every offset against the text
    assert [(d.pmid, d.text) for d in written] == [(d.pmid, d.text) for d in gold]
    assert [[(a.start, a.end, a.text, a.id) for a in d.annotations] for d in written] == [
        [(e["start"], e["end"], e["text"], e["concept_id"]) for e in r["entities"]] for r in records
    ]
    assert all(part in kb for d in written for a in d.annotations for part in a.id.split("|"))
    assert {a.type for d in written for a in d.annotations} == {"Disease"}

    # JSONL texts with line breaks and a record without entities still give a PubTator file that reads back
    annotate(pipeline_dir, write_jsonl(tmp_path / "in.jsonl"), tmp_path / "docs.pubtator", progress=False)
    docs = list(pubtator.iterparse(open(tmp_path / "docs.pubtator", encoding="utf-8")))
    assert [d.pmid for d in docs] == [i for i, t in DOCS if t]  # bioc drops the empty document
    assert docs[3].text == "Hemochromatosis\nwith Mitral Valve Prolapse."
    assert [(a.start, a.end) for a in docs[3].annotations] == [(0, 15), (21, 42)]
    assert read_done_ids(tmp_path / "docs.pubtator", "pubtator") == {i for i, _ in DOCS}


def test_pubtator_is_read_and_written_by_the_corpus_module(tmp_path):
    entity = {"start": 0, "end": 5, "text": "Title", "label": "Disease", "concept_id": None}
    block = pubtator_record(7, "Title ends in a space \nAbstract.", [entity], include_text=False)
    assert block == "7|t|Title ends in a space \n7|a|Abstract.\n7\t0\t5\tTitle\tDisease\t\n\n"
    path = tmp_path / "one.pubtator"
    path.write_text(block, encoding="utf-8")
    (doc,) = read_pubtator(path)  # the gold reader: the title as written, the empty id an annotation
    assert doc.text == "Title ends in a space \nAbstract." and [(a.start, a.end, a.id) for a in doc.annotations] == [
        (0, 5, "")
    ]
    problems = []
    assert list(read_pubtator_input(path, lambda *p: problems.append(p))) == [(1, "7", doc.text)] and not problems
    path.write_text("1|t|Title.\n1\tzero\t5\tTitle\tDisease\tD1\n", encoding="utf-8")
    with pytest.raises(ConceptNormError, match=r"one.pubtator:2: cannot parse PubTator \(unreadable annotation"):
        list(read_pubtator(path))
    assert list(read_pubtator_input(path, lambda *p: problems.append(p))) == []
    assert problems == [(path, 2, "malformed PubTator block: unreadable annotation line (invalid literal for int() "
                         "with base 10: 'zero')")]  # fmt: skip


def test_txt_file_and_directory(pipeline_dir, tmp_path):
    lines = tmp_path / "notes.txt"
    lines.write_text("Breast cancer here.\n\nNothing.\nPhenylketonuria.\n", encoding="utf-8")
    annotate(pipeline_dir, lines, tmp_path / "lines.jsonl", include_text=True, progress=False)
    records = read_jsonl(tmp_path / "lines.jsonl")
    assert [(r["id"], r["text"]) for r in records] == [
        ("notes.txt:1", "Breast cancer here."),
        ("notes.txt:3", "Nothing."),
        ("notes.txt:4", "Phenylketonuria."),
    ]
    assert [len(r["entities"]) for r in records] == [1, 0, 1]

    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("Hemochromatosis.\nAnd breast cancer.\n", encoding="utf-8")
    (folder / "sub" / "a.txt").write_text("Ovarian cancer.", encoding="utf-8")
    (folder / "skip.json").write_text('{"id": 1, "text": "breast cancer"}', encoding="utf-8")
    annotate(pipeline_dir, folder, tmp_path / "dir.jsonl", include_text=True, progress=False)
    records = read_jsonl(tmp_path / "dir.jsonl")
    assert [r["id"] for r in records] == ["b.txt", "sub/a.txt"]
    assert records[0]["text"] == "Hemochromatosis.\nAnd breast cancer.\n"
    assert [e["start"] for e in records[0]["entities"]] == [0, 21]

    with pytest.raises(ConceptNormError, match="is a directory"):
        annotate(pipeline_dir, folder, tmp_path / "x.jsonl", input_format="jsonl", progress=False)


def test_format_overrides(pipeline_dir, tmp_path):
    data = write_jsonl(tmp_path / "docs.data", DOCS[:2])
    with pytest.raises(ConceptNormError, match="output format"):
        annotate(pipeline_dir, data, tmp_path / "out.result", progress=False)
    annotate(pipeline_dir, data, tmp_path / "out.result", output_format="jsonl", progress=False)
    assert [r["id"] for r in read_jsonl(tmp_path / "out.result")] == ["d1", "d2"]  # .data sniffed as JSONL
    annotate(pipeline_dir, data, tmp_path / "as_text.jsonl", input_format="txt", include_text=True, progress=False)
    assert read_jsonl(tmp_path / "as_text.jsonl")[0]["id"] == "docs.data:1"
    with pytest.raises(ConceptNormError, match="Unknown input format"):
        annotate(pipeline_dir, data, tmp_path / "y.jsonl", input_format="csv", progress=False)


@Language.component("test_annotate_interrupt")
def interrupt(doc):
    if "STOP" in doc.text:
        raise KeyboardInterrupt
    return doc


@pytest.mark.parametrize("suffix", [".jsonl", ".pubtator"])
def test_resume_after_interruption_and_truncation(pipeline_dir, tmp_path, suffix):
    docs = [(f"{n}", f"Case {n}: breast cancer and hemochromatosis.") for n in range(10)]
    source = write_jsonl(tmp_path / "in.jsonl", docs)
    clean = tmp_path / f"clean{suffix}"
    annotate(pipeline_dir, source, clean, batch_size=2, progress=False)
    expected = clean.read_bytes()

    # interrupted by Ctrl-C at doc 7: the batches before it are on disk, complete
    out = tmp_path / f"out{suffix}"
    stopping = write_jsonl(tmp_path / "stop.jsonl", docs[:7] + [("7", "STOP " + docs[7][1])] + docs[8:])
    nlp = spacy.load(pipeline_dir)
    nlp.add_pipe("test_annotate_interrupt", first=True)
    with pytest.raises(KeyboardInterrupt):
        annotate(nlp, stopping, out, batch_size=2, progress=False)
    assert 0 < len(out.read_bytes()) < len(expected) and expected.startswith(out.read_bytes())
    summary = annotate(pipeline_dir, source, out, batch_size=2, progress=False)
    assert out.read_bytes() == expected
    assert summary.skipped > 0 and summary.skipped + summary.written == 10

    # a half-written last record is cut off, then the rest written again
    out.write_bytes(expected[: len(expected) // 2 + 7])
    with pytest.warns(UserWarning, match="half-written record"):
        summary = annotate(pipeline_dir, source, out, batch_size=2, progress=False)
    assert out.read_bytes() == expected and summary.written < 10

    # whole records deleted from the end are simply redone; a finished output is left as it is
    end = b"\n" if suffix == ".jsonl" else b"\n\n"
    out.write_bytes(expected[: expected.rfind(end, 0, len(expected) - 2) + len(end)])
    annotate(pipeline_dir, source, out, batch_size=2, progress=False)
    assert out.read_bytes() == expected
    summary = annotate(pipeline_dir, source, out, batch_size=2, progress=False)
    assert (summary.written, summary.skipped) == (0, 10) and out.read_bytes() == expected


@Language.component("test_annotate_ctrl_c")
def ctrl_c(doc):
    if doc.text.startswith("Case 3:"):  # as if the user pressed Ctrl-C: to the annotating process, not a worker
        os.kill(os.getppid() if multiprocessing.parent_process() else os.getpid(), signal.SIGINT)
    return doc


@pytest.mark.parametrize("n_process", [1, 2])
def test_ctrl_c_finishes_the_documents_in_flight(pipeline_dir, tmp_path, n_process):
    source = write_jsonl(tmp_path / "in.jsonl", [(f"{n}", f"Case {n}: breast cancer.") for n in range(40)])
    annotate(pipeline_dir, source, tmp_path / "clean.jsonl", batch_size=2, progress=False)
    expected = (tmp_path / "clean.jsonl").read_bytes()
    nlp = spacy.load(pipeline_dir)
    nlp.add_pipe("test_annotate_ctrl_c", first=True)
    out = tmp_path / "out.jsonl"
    before = signal.getsignal(signal.SIGINT)  # whatever the test runner has installed
    with pytest.raises(KeyboardInterrupt):
        annotate(nlp, source, out, batch_size=2, n_process=n_process, progress=False)
    assert 4 <= out.read_bytes().count(b"\n") < 40 and expected.startswith(out.read_bytes())
    assert signal.getsignal(signal.SIGINT) is before  # restored
    annotate(pipeline_dir, source, out, batch_size=2, progress=False)
    assert out.read_bytes() == expected


def test_resume_refuses_a_foreign_file(pipeline_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "d1", "entities": []}\nnot json\n', encoding="utf-8")
    with pytest.raises(ConceptNormError, match="out.jsonl:2: expected a JSON record"):
        annotate(pipeline_dir, write_jsonl(tmp_path / "in.jsonl"), out, progress=False)
    assert out.read_text(encoding="utf-8").endswith("not json\n")  # untouched


def test_malformed_lines_are_skipped_or_fail_with_strict(pipeline_dir, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b'{"id": "a", "text": "Breast cancer."}\n'
        b'{"id": "b", "text": \n'
        b'{"text": "no id"}\n'
        b'{"id": "c"}\n'
        b'{"id": "d", "text": "caf\xe9"}\n'
        b"\n"
        b'{"id": "a", "text": "Phenylketonuria."}\n'
        b'{"id": "e", "text": "Phenylketonuria."}\n'
    )
    out = tmp_path / "out.jsonl"
    with pytest.warns(UserWarning) as caught:
        summary = annotate(pipeline_dir, source, out, progress=False)
    messages = [str(w.message) for w in caught]
    for line, problem in [(2, "invalid JSON"), (3, "no 'id'"), (4, "no 'text'"), (5, "not UTF-8"), (7, "duplicate")]:
        assert any(m.startswith(f"[E801] {source}:{line}: {problem}") for m in messages), (line, messages)
    assert [r["id"] for r in read_jsonl(out)] == ["a", "e"]
    assert (summary.written, summary.malformed, summary.duplicates) == (2, 4, 1)

    for n_process in (1, 2):  # the documents before the bad line are finished and written, the workers end
        strict_out = tmp_path / f"strict{n_process}.jsonl"
        with pytest.raises(ConceptNormError, match=r"in.jsonl:2: invalid JSON"):
            annotate(pipeline_dir, source, strict_out, strict=True, n_process=n_process, progress=False)
        assert [r["id"] for r in read_jsonl(strict_out)] == ["a"]


def test_malformed_pubtator_block_is_skipped(pipeline_dir, tmp_path):
    source = tmp_path / "in.pubtator"
    source.write_text(
        "1|t|Breast cancer.\n1|a|More text.\n1\t0\t13\tBreast cancer\tDisease\tD001943\n\n"
        "2|t|Phenylketonuria.\n2 0 15 broken\n2|a|Abstract.\n\n"
        "3|t|Hemochromatosis.\n4|a|Wrong PMID.\n\n"
        "5|t|Ovarian cancer.\n",
        encoding="utf-8",
    )
    with pytest.warns(UserWarning) as caught:
        summary = annotate(pipeline_dir, source, tmp_path / "out.jsonl", progress=False)
    messages = [str(w.message) for w in caught]
    assert any(m.startswith(f"[E801] {source}:6: malformed PubTator block") for m in messages), messages
    assert any(m.startswith(f"[E801] {source}:10: malformed PubTator block: PMID 4") for m in messages), messages
    assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")] == ["1", "5"]
    assert summary.malformed == 2
    with pytest.raises(ConceptNormError, match=r"in.pubtator:6: malformed PubTator block"):
        annotate(pipeline_dir, source, tmp_path / "strict.jsonl", strict=True, progress=False)


def test_n_process_2_gives_the_same_output(pipeline_dir, tmp_path):
    docs = [(f"{doc_id}-{n}", text) for n in range(6) for doc_id, text in DOCS]
    source = write_jsonl(tmp_path / "in.jsonl", docs)
    annotate(pipeline_dir, source, tmp_path / "one.jsonl", batch_size=4, include_text=True, progress=False)
    summary = annotate(
        pipeline_dir, source, tmp_path / "two.jsonl", n_process=2, batch_size=4, include_text=True, progress=False
    )
    assert summary.written == len(docs) and summary.entities == 6 * 6
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


def test_texts_longer_than_max_length_are_annotated_in_pieces(pipeline_dir, tmp_path):
    text = " ".join(f"Case {n} had breast cancer.\nAnd phenylketonuria." for n in range(6))
    pieces = split_text(text, 80)
    assert len(pieces) == 5 and all(len(piece) <= 80 for _, piece in pieces)
    assert "".join(piece for _, piece in pieces) == text and all(text[start] == "\n" for start, _ in pieces[1:])
    source = write_jsonl(tmp_path / "in.jsonl", [("long", text)])
    annotate(pipeline_dir, source, tmp_path / "whole.jsonl", progress=False)
    with pytest.warns(UserWarning, match="annotated in 5 pieces"):
        annotate(pipeline_dir, source, tmp_path / "pieces.jsonl", max_length=80, progress=False)
    (whole,) = read_jsonl(tmp_path / "whole.jsonl")
    (cut,) = read_jsonl(tmp_path / "pieces.jsonl")
    assert len(whole["entities"]) == 12 and cut["entities"] == whole["entities"]
    assert all(text[e["start"] : e["end"]] == e["text"] for e in cut["entities"])


def test_cli(pipeline_dir, tmp_path):
    runner = CliRunner()
    source = write_jsonl(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["annotate", str(pipeline_dir), str(source), str(out), "--include-text"])
    assert result.exit_code == 0, result.output
    assert "6 documents written, 0 skipped (already done), 0 malformed" in result.output
    assert [r["text"] for r in read_jsonl(out)] == [t for _, t in DOCS]

    result = runner.invoke(app, ["annotate", str(pipeline_dir), str(source), str(out), "--quiet"])
    assert result.exit_code == 0 and result.output == ""

    source.write_text(source.read_text(encoding="utf-8") + "{broken\n", encoding="utf-8")
    args = ["annotate", str(pipeline_dir), str(source), str(tmp_path / "p.txt"), "--output-format", "pubtator"]
    result = runner.invoke(app, [*args, "--strict", "--batch-size", "2", "--n-process", "1"])
    assert result.exit_code == 1 and f"{source}:7: invalid JSON" in result.output
    assert [d.pmid for d in read_pubtator(tmp_path / "p.txt")] == [i for i, _ in DOCS]  # written before the failure
