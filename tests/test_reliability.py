"""Issue 15: silent wrong results, lost data, crashes and hangs, each with its reproducer. Built on the trigram test
encoder (fast) unless a test needs the real one."""

from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy.language import Language
from spacy.training import Example

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import DOMAIN, SOURCE_BITS, load_kb

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

ENCODER = {"@misc": "test_reliability.trigram_encoder.v1"}


@spacy.registry.misc("test_reliability.trigram_encoder.v1")
def trigram_encoder() -> TrigramEncoder:
    return TrigramEncoder()


@pytest.fixture
def nlp(train_docs) -> Language:
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": ENCODER})
    normalizer.initialize(
        lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt")
    )
    return nlp


def link(nlp: Language, text: str) -> tuple[str, list]:
    doc = nlp.make_doc(text)
    doc.ents = [doc.char_span(0, len(text), label="Disease")]
    ent = nlp(doc).ents[0]
    return ent.kb_id_, ent._.kb_ents


# --- 1. add_synonyms / remove_synonyms -------------------------------------------------------------------------
def test_a_bad_synonym_or_a_failed_encoding_changes_nothing_and_later_saves_load(nlp, tmp_path, monkeypatch):
    normalizer = nlp.get_pipe("concept_normalizer")
    rows = len(normalizer.searcher.row_names)
    with pytest.raises(ConceptNormError, match=r"\[E303\].*None"):
        normalizer.add_synonyms([("zzq new text", "D001943"), None])
    monkeypatch.setattr(normalizer.encoder, "encode", lambda texts, **kw: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        normalizer.add_synonyms([("zzq other text", "D001943")])
    monkeypatch.undo()
    kb = normalizer.kb
    assert kb.concepts_for("zzq new text") == [] == kb.concepts_for("zzq other text")
    assert len(normalizer.searcher.row_names) == rows
    for bad in ([None], [("a", "b", "c")], [(1, "D001943")], [("a", 5)], "breast cancer"):
        with pytest.raises(ConceptNormError, match=r"\[E985\]"):
            normalizer.remove_synonyms(bad)
    nlp.to_disk(tmp_path / "pipeline")
    assert len(spacy.load(tmp_path / "pipeline").get_pipe("concept_normalizer").kb) == len(kb)


def test_adding_then_removing_a_domain_synonym_keeps_the_original(nlp):
    normalizer = nlp.get_pipe("concept_normalizer")
    kb = normalizer.kb
    name = kb.names(DOMAIN)[0]
    concept = kb.concepts_for(name, SOURCE_BITS[DOMAIN])[0]
    normalizer.add_synonyms([(name, concept)])
    normalizer.remove_synonyms([(name, concept)])
    assert concept in kb.concepts_for(name, SOURCE_BITS[DOMAIN])  # the original stays
    normalizer.remove_synonyms([(name, concept)])
    assert concept not in kb.concepts_for(name, SOURCE_BITS[DOMAIN])
    with normalizer.synonyms_hidden([]):
        pass


def test_add_remove_cycles_reuse_the_rows_of_removed_names(nlp, tmp_path):
    normalizer = nlp.get_pipe("concept_normalizer")
    searcher, generator = normalizer.searcher, normalizer.linker.candidate_generator()
    rows = len(searcher.row_names)
    for cycle in range(3):
        pairs = [(f"zzq cycle {cycle} name {i}", "D001943") for i in range(40)]
        normalizer.add_synonyms(pairs)
        assert link(nlp, pairs[0][0])[0] == "D001943"
        # the lexical index follows rows taken over by new names
        row = searcher.rows[f"zzq cycle {cycle} name 7"]
        assert generator.lexical.scores([f"zzq cycle {cycle} name 7"])["tfidf"][0, row] == pytest.approx(1.0)
        normalizer.remove_synonyms(pairs)
    assert len(searcher.row_names) == len(searcher.vectors) == len(generator.lexical) == rows + 40
    normalizer.add_synonyms([("zzq cycle 0 name 3", "D001943")])
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    assert link(loaded, "zzq cycle 0 name 3") == link(nlp, "zzq cycle 0 name 3")
    assert link(loaded, "zzq cycle 2 name 3")[0] == link(nlp, "zzq cycle 2 name 3")[0]


def test_hidden_synonyms_come_back_with_their_vectors(nlp):
    normalizer = nlp.get_pipe("concept_normalizer")
    searcher = normalizer.searcher
    name = next(n for n in normalizer.kb.names(DOMAIN) if normalizer.kb.concepts_for(n) and not
                normalizer.kb.concepts_for(n, SOURCE_BITS["ontology"]))  # fmt: skip
    concept = normalizer.kb.concepts_for(name)[0]
    before = searcher.vectors[searcher.rows[name]].copy()
    calls = len(normalizer.encoder.calls)
    with normalizer.synonyms_hidden([(name, concept)]) as hidden:
        assert hidden == [(name, concept)] and name not in searcher.rows
    assert np.array_equal(searcher.vectors[searcher.rows[name]], before)
    assert len(normalizer.encoder.calls) == calls  # nothing re-encoded


# --- 3. KB loaders ------------------------------------------------------------------------------------------------
MRCONSO_ROW = "{cui}|ENG|P|L1|PF|S1|Y|A1||||MSH|MH|D1|{name}|0|N||"
KB_FILES = {  # format: (file name, a file of two concepts, the first with a synonym)
    "medic": ("kb.txt", "C565588|614|x||Alpha disease|alpha syndrome\nD000002||Beta disease\n"),
    "ctd": ("kb.tsv", "Alpha disease\tMESH:C565588\t\t\t\t\t\talpha syndrome\nBeta disease\tMESH:D000002\n"),
    "jsonl": ("kb.jsonl", '{"concept_id": "C565588", "canonical_name": "Alpha disease", "aliases": '
                          '["alpha syndrome"]}\n{"concept_id": "D000002", "canonical_name": "Beta disease"}\n'),
    "obo": ("kb.obo", '[Term]\nid: C565588\nname: Alpha disease\nsynonym: "alpha syndrome" EXACT []\n\n'
                      "[Term]\nid: D000002\nname: Beta disease\n"),
    "mrconso": ("MRCONSO.RRF", "\n".join([MRCONSO_ROW.format(cui="C565588", name="Alpha disease"),
                                          MRCONSO_ROW.format(cui="C565588", name="alpha syndrome"),
                                          MRCONSO_ROW.format(cui="D000002", name="Beta disease")]) + "\n"),
}  # fmt: skip


@pytest.mark.parametrize("fmt", KB_FILES)
def test_a_byte_order_mark_and_any_line_ending_load_the_same_kb(tmp_path, fmt):
    import gzip

    name, text = KB_FILES[fmt]
    variants = {
        "bom": b"\xef\xbb\xbf" + text.encode(),
        "crlf": text.replace("\n", "\r\n").encode(),
        "cr": text.replace("\n", "\r").encode(),
        "bom+cr.gz": gzip.compress(b"\xef\xbb\xbf" + text.replace("\n", "\r").encode()),
    }
    for variant, data in variants.items():
        path = tmp_path / variant / (name + (".gz" if variant.endswith(".gz") else ""))
        path.parent.mkdir()
        path.write_bytes(data)
        kb = load_kb(path, format=fmt)
        first = kb.resolve("C565588")  # CTD keeps its MESH: prefix
        assert len(kb) == 2 and first in ("C565588", "MESH:C565588") and kb.resolve("D000002"), variant
        assert kb.concepts_for("alpha syndrome") == [first], variant


def test_an_obo_stanza_without_its_header_is_refused(tmp_path):
    path = tmp_path / "kb.obo"
    path.write_text('[Term]\nid: A:1\nname: alpha\n\nid: A:2\nname: beta\nsynonym: "b" EXACT []\n')
    with pytest.raises(ConceptNormError, match=r"kb\.obo:5: malformed line \(an 'id' outside"):
        load_kb(path)
    path.write_text("format-version: 1.2\nid: A:1\nname: alpha\n")
    with pytest.raises(ConceptNormError, match=r"kb\.obo:2: malformed line"):
        load_kb(path)


def test_unreadable_kb_files_raise_the_package_error_naming_them(tmp_path):
    import gzip

    data = gzip.compress(("C1||alpha\n" * 2000).encode())
    cases = {
        "truncated.txt.gz": (data[: len(data) // 2], "truncated or corrupt"),
        "garbage.txt.gz": (b"not gzip at all", "truncated or corrupt"),
        "flipped.txt.gz": (data[:30] + bytes([data[30] ^ 0xFF]) + data[31:], "truncated or corrupt"),
        "empty.txt": (b"", "holds no concept"),
        "blank.obo": (b"\n\n", "holds no concept"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConceptNormError, match=rf"{name}.*{message}|{message}.*{name}"):
            load_kb(tmp_path / name)
    (tmp_path / "folder.txt").mkdir()
    with pytest.raises(ConceptNormError, match=r"\[E982\] Cannot read .*folder.txt: it is a directory"):
        load_kb(tmp_path / "folder.txt")


# --- 4. batch-independent results ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_encoder():
    from spacy_conceptnorm.ml.name_encoder import NameEncoder

    return NameEncoder(precision="auto")


def test_a_query_vector_does_not_depend_on_the_texts_encoded_with_it(real_encoder):
    texts = ["breast cancer", "ataxia telangiectasia", "a", "hereditary nonpolyposis colorectal cancer syndrome",
             "DM1", "von Hippel-Lindau disease", "cancer", "autosomal dominant polycystic kidney disease",
             "Sjogren syndrome", "ovarian and breast carcinoma", "G6PD deficiency"]  # fmt: skip
    together = real_encoder.encode_queries(texts)
    alone = np.concatenate([real_encoder.encode_queries([t]) for t in texts])
    reversed_ = real_encoder.encode_queries(texts[::-1])[::-1]
    assert np.array_equal(together, alone) and np.array_equal(together, reversed_)
    # the same vectors as `encode`, up to the last bits: of fp32, or of bf16 where the CPU has native bf16 (autocast;
    # seen there: 7.5e-4 at most, cosines above 0.99998)
    atol = 1e-4 if real_encoder.autocast_dtype() is None else 2e-3
    assert np.allclose(together, real_encoder.encode(texts), atol=atol)


def test_kb_ents_are_bitwise_identical_whatever_the_batch_size(real_encoder, test_docs, tmp_path):
    from .test_component import blank_copy

    lines = (FIXTURES / "medic_sample.txt").read_text().splitlines()
    (tmp_path / "kb.txt").write_text("\n".join(lines[::16]) + "\n")
    nlp = spacy.blank("en")
    normalizer = nlp.add_pipe("concept_normalizer")
    normalizer.encoder = real_encoder
    normalizer.initialize(nlp=nlp, kb=load_kb(tmp_path / "kb.txt"))
    runs = []
    for batch_size in (1, 3, 64):
        normalizer.linker._cache.clear()  # linked texts are remembered across batches
        docs = nlp.pipe([blank_copy(d) for d in test_docs], batch_size=batch_size)
        runs.append([(e.kb_id_, e._.kb_ents) for d in docs for e in d.ents])
    assert len(runs[0]) > 50 and runs[0] == runs[1] == runs[2]
    assert all(isinstance(s, float) for _, ents in runs[0] for _, s in ents)


# --- 5. composite splitter ----------------------------------------------------------------------------------------
def test_the_splitters_own_placeholder_characters_in_a_mention_are_kept_as_text():
    from spacy_conceptnorm.text.composites import split_composite

    assert split_composite("foo \ue0005\ue001 and bar") == ["foo \ue0005\ue001", "foo bar"]
    parts = split_composite("foo \ue0000\ue001 and hand, foot and mouth disease")
    assert parts == ["foo \ue0000\ue001", "foo hand, foot and mouth disease"]  # the protected name once
    assert split_composite("\ue000 and \ue001") == ["\ue000", "\ue001"]


def test_one_entity_that_cannot_be_split_does_not_stop_the_batch():
    nlp = spacy.blank("en")
    splitter = nlp.add_pipe("composite_splitter")
    splitter.is_known_name = lambda text: 1 / 0 if "odd" in text else False
    docs = [nlp.make_doc(t) for t in ("odd and even cancer", "breast and ovarian cancer")]
    for doc in docs:
        doc.ents = [doc.char_span(0, len(doc.text), label="Disease")]
    with pytest.warns(UserWarning, match=r"\[W980\].*odd and even cancer.*ZeroDivisionError"):
        done = list(nlp.pipe(docs))
    assert done[0].ents[0]._.composite_parts is None
    assert list(done[1].ents[0]._.composite_parts) == ["breast cancer", "ovarian cancer"]


def test_a_40k_character_mention_is_left_whole():
    from spacy_conceptnorm.text.composites import split_composite

    for text in ("a, " * 2000 + "b and " + "w " * 10000, "a and " + "word " * 8000):  # both grew quadratically
        assert split_composite(text) == [text]
    assert len(split_composite("a and " + "word " * 150)) == 2  # long, under the cap: split, in linear time


# --- 6. annotate: poison records, the output path, the resume scan -----------------------------------------------
@pytest.fixture(scope="module")
def ruler_nlp() -> Language:
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "breast cancer"}])
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": ENCODER})
    normalizer.initialize(nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt"))
    return nlp


def test_a_lone_surrogate_is_reported_and_skipped_like_a_malformed_line(ruler_nlp, tmp_path):
    import json

    from spacy_conceptnorm.annotate import annotate

    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "breast cancer"}\n{"id": "s", "text": "a \\ud800 b"}\n'
                      '{"id": "\\udc00", "text": "x"}\n{"id": "b", "text": "no disease"}\n')  # fmt: skip
    for _ in range(2):  # and the rerun does not stop there either
        with pytest.warns(UserWarning, match=r"in\.jsonl:2: a lone surrogate"):
            summary = annotate(ruler_nlp, source, tmp_path / "out.jsonl", progress=False)
        assert summary.malformed == 2
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "b"] and records[0]["entities"][0]["concept_id"]


def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path):
    from spacy_conceptnorm.annotate import annotate

    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "breast cancer"}\n')
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_dir.jsonl").mkdir()
    missing_model = tmp_path / "no-such-pipeline"  # loading it would fail: the output must be checked first
    for output, problem in [
        (tmp_path / "a_dir.jsonl", "it is a directory"),
        (Path("/dev/full"), "it is not a regular file"),
        (tmp_path / "a_file" / "out.jsonl", f"{tmp_path / 'a_file'} is a file, not a directory"),
        (Path("/proc/version.jsonl"), ""),
    ]:
        with pytest.raises(ConceptNormError, match=rf"\[E986\] Cannot write the output {output}: {problem}"):
            annotate(missing_model, source, output, output_format="jsonl", progress=False)


def _limit_file_size() -> None:
    """In the child: files may not grow past 2000 bytes; past it a write fails with EFBIG (SIGXFSZ ignored, as a
    shell's `ulimit -f` leaves it)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))


def test_annotate_past_a_file_size_limit_stops_with_e986_and_resumes(tmp_path):
    pytest.importorskip("resource")  # POSIX
    import json
    import subprocess
    import sys

    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "breast cancer"}])
    nlp.to_disk(tmp_path / "pipeline")
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "text": "Familial breast cancer. " * 5}) + "\n"
                              for i in range(50)))  # fmt: skip
    command = [sys.executable, "-m", "spacy_conceptnorm", "annotate", str(tmp_path / "pipeline"), str(source), str(out)]
    root = Path(__file__).parent.parent
    run = subprocess.run([*command, "--batch-size", "4", "--quiet"], cwd=root, preexec_fn=_limit_file_size,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert f"[E986] Cannot write the output {out}: File too large" in run.stderr
    assert "Traceback" not in run.stderr and out.stat().st_size == 2000
    run = subprocess.run([*command, "--quiet"], cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [str(i) for i in range(50)]


def test_the_resume_scan_reads_bounded_lines(tmp_path, monkeypatch):
    from spacy_conceptnorm.annotate import read_done_ids, resume

    monkeypatch.setattr(resume, "MAX_LINE_BYTES", 1000, raising=False)
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "entities": []}\n{"id": "' + "b" * 5000 + '", "entities": []}\n')
    with pytest.raises(ConceptNormError, match=r"out\.jsonl:2: expected lines under 1000 bytes"):
        read_done_ids(out, "jsonl")
    with pytest.raises(ConceptNormError, match=r"\[E986\].*/dev/zero: it is not a regular file"):
        read_done_ids(Path("/dev/zero"), "jsonl")  # endless: it was read until memory ran out


# --- 7. annotate --n-process: workers die with their parent; a worker's exception ends the run ------------------
WORKER_SCRIPT = """
import json, multiprocessing, os, sys, time
import spacy
from spacy.language import Language
from spacy_conceptnorm.annotate import annotate

@Language.component("test_reliability_slow")
def slow(doc):
    if multiprocessing.parent_process() is not None:  # a worker: tell the test its pid
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(0.2)
    return doc

nlp = spacy.blank("en")
nlp.add_pipe("test_reliability_slow")
source = os.path.join(sys.argv[1], "in.jsonl")
with open(source, "w") as f:
    f.writelines(json.dumps({"id": str(i), "text": "breast cancer"}) + "\\n" for i in range(1000))
annotate(nlp, source, os.path.join(sys.argv[1], "out.jsonl"), n_process=2, batch_size=2, progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_annotate_killed_leaves_no_worker_and_resumes(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import warnings

    parent = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(tmp_path)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(workers := [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers))
        # and the run resumes: every document once, in order (a half-written last record cut off)
        from spacy_conceptnorm.annotate import annotate

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            annotate(spacy.blank("en"), tmp_path / "in.jsonl", tmp_path / "out.jsonl", progress=False)
        ids = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert ids == [str(i) for i in range(1000)]
    finally:
        parent.kill()
        for pid in [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@Language.component("test_reliability_boom")
def boom(doc):
    if doc.text.startswith("BOOM"):
        raise RuntimeError("a component failed")
    return doc


def test_an_exception_in_a_worker_ends_the_run_and_keeps_the_finished_records(ruler_nlp, tmp_path):
    import json

    from spacy_conceptnorm.annotate import annotate

    source = tmp_path / "in.jsonl"
    texts = [("BOOM " if i == 30 else "") + "breast cancer " * 100 for i in range(60)]
    source.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    annotate(ruler_nlp, source, tmp_path / "clean.jsonl", batch_size=4, progress=False)
    ruler_nlp.add_pipe("test_reliability_boom", first=True)
    try:
        with pytest.raises(ConceptNormError, match=r"\[E987\] .*worker process failed: RuntimeError: a component"):
            annotate(ruler_nlp, source, tmp_path / "out.jsonl", n_process=2, batch_size=4, progress=False)
    finally:
        ruler_nlp.remove_pipe("test_reliability_boom")
    kept = (tmp_path / "out.jsonl").read_bytes()
    assert kept.count(b"\n") >= 20 and (tmp_path / "clean.jsonl").read_bytes().startswith(kept)
    annotate(ruler_nlp, source, tmp_path / "out.jsonl", batch_size=4, progress=False)  # resumed
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "clean.jsonl").read_bytes()


# --- 8. the OpenMP wait policy under contention ------------------------------------------------------------------
@pytest.fixture
def spinning(monkeypatch):
    """torch loaded before the package with no wait policy chosen (its threads spin), two torch threads, a CPU
    budget of two; yields the `threads` module, and restores the thread count and the policy afterwards."""
    import torch

    from spacy_conceptnorm.ml import threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "cpu_budget", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    threads.passive_openmp_by_default()  # torch is loaded: its threads spin
    yield threads
    torch.set_num_threads(before)
    monkeypatch.undo()
    threads.passive_openmp_by_default()


def test_spinning_threads_drop_to_one_only_while_the_machine_is_oversubscribed(spinning, monkeypatch):
    import torch

    threads = spinning
    for load, inside in [(1.5, 2), (2.0, 2), (3.2, 1)]:
        monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, load, load))
        with threads.one_thread_if_oversubscribed():
            assert torch.get_num_threads() == inside
        assert torch.get_num_threads() == 2  # restored
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    threads.passive_openmp_by_default()  # a chosen policy: left alone even under load
    with threads.one_thread_if_oversubscribed():
        assert torch.get_num_threads() == 2


def test_a_training_run_on_spinning_threads_takes_one_thread_when_it_starts_on_a_busy_machine(spinning, monkeypatch):
    import torch

    threads = spinning
    # (1-minute load average, other processes' runnable threads now, count chosen) -> threads for the run
    for load, elsewhere, chosen, inside in [(0.4, 0, 0, 2), (0.4, 1, 0, 1), (3.5, 0, 0, 1), (3.5, 1, 2, 2)]:
        monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, load, load))
        monkeypatch.setattr(threads, "runnable_elsewhere", lambda elsewhere=elsewhere: elsewhere)
        with threads.training_threads(chosen) as count:
            assert count == torch.get_num_threads() == inside
        assert torch.get_num_threads() == 2  # restored
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    threads.passive_openmp_by_default()  # a chosen policy: left alone even under load
    with threads.training_threads() as count:
        assert count == 2


def test_runnable_elsewhere_reads_the_kernels_count_of_runnable_threads(monkeypatch):
    from spacy_conceptnorm.ml import threads

    readings = iter(["0.1 0.2 0.3 1/90 7", "2.0 1.0 0.5 4/91 8", "2.0 1.0 0.5 3/91 8"])
    monkeypatch.setattr(threads, "_read", lambda path: next(readings))
    assert threads.runnable_elsewhere(samples=3, interval=0) == 2  # median of 0, 3, 2 (this thread not counted)
    monkeypatch.setattr(threads, "_read", lambda path: None)  # no /proc
    assert threads.runnable_elsewhere(samples=3, interval=0) == 0


@pytest.mark.parametrize(
    "v2, v1_quota, expected",
    [
        ("150000 100000", None, 2),  # 1.5 CPUs of quota: two threads
        ("100000 100000", None, 1),
        ("max 100000", None, 4),  # no quota: the affinity mask
        (None, "50000", 1),  # cgroup v1, period 100000
        (None, "-1", 4),
        ("garbage", None, 4),
        (None, None, 4),  # no cgroup files at all
    ],
)
def test_the_cpu_budget_follows_the_cgroup_quota(tmp_path, monkeypatch, v2, v1_quota, expected):
    from spacy_conceptnorm.ml import threads

    for name, value in [("CGROUP_V2_MAX", v2), ("CGROUP_V1_QUOTA", v1_quota), ("CGROUP_V1_PERIOD", "100000")]:
        path = tmp_path / name
        if value is not None:
            path.write_text(value + "\n")
        monkeypatch.setattr(threads, name, str(path))
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert threads.cpu_budget() == expected


def test_torch_and_faiss_threads_are_cut_to_the_budget_unless_the_user_chose(monkeypatch):
    import faiss
    import torch

    from spacy_conceptnorm.ml import threads

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        torch.set_num_threads(3)
        faiss.omp_set_num_threads(3)
        monkeypatch.setattr(threads, "cpu_budget", lambda: 1)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        threads.threads_within_budget()
        assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == (3, 3)  # the user's number stands
        monkeypatch.delenv("OMP_NUM_THREADS")
        threads.threads_within_budget()
        assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


def test_the_package_imported_before_torch_makes_openmp_waits_passive(monkeypatch):
    import os
    import subprocess
    import sys

    from spacy_conceptnorm.ml.threads import passive_openmp_by_default

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import os, spacy_conceptnorm; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "PASSIVE"  # the command line, and scripts that import the package first
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    passive_openmp_by_default()  # torch is loaded here: too late to matter, left alone
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")  # as if torch were not loaded yet (put back after the test)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    passive_openmp_by_default()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's choice stands
    monkeypatch.delenv("OMP_WAIT_POLICY")
    passive_openmp_by_default()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
