"""`annotate --engine ray` on a local Ray instance (2 CPUs, started once for the module): the same records as the
local engine, resuming shard by shard (nothing lost, nothing twice), a failing actor, the CLI. Skipped where Ray Data
is not installed (CI installs the `ray` extra). Ray starts in 5-10 s and each run starts its actors, which import
spaCy and torch and load the pipeline, so the tests that run Ray are in the slow set and make four runs in all."""

import json
from pathlib import Path

import pytest
import spacy
from typer.testing import CliRunner

from spacy_conceptnorm.annotate import annotate, annotate_ray, parts_dir, ray_engine
from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import load_kb

from . import ray_encoder
from .conftest import FIXTURES

pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'spacy-conceptnorm[ray]')")

PATTERNS = ["breast cancer", "ovarian cancer", "breast and ovarian cancer", "phenylketonuria", "hemochromatosis"]
TEXTS = [
    "Familial breast cancer and phenylketonuria were seen.",
    "Carriers of breast and ovarian cancer risk alleles.",
    "",
    "No disease is named here.",
    "Hemochromatosis\nwith breast cancer.",
    "Ünïcode — breast cancer again.",
]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    root = str(Path(__file__).parents[1])  # so that the workers can import tests.ray_encoder
    hook = {"worker_process_setup_hook": f"{ray_encoder.__name__}.register", "env_vars": {"PYTHONPATH": root}}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=hook)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory) -> Path:
    """entity_ruler + composite_splitter + concept_normalizer over the MEDIC sample, with the trigram encoder."""
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in PATTERNS])
    nlp.add_pipe("composite_splitter")
    config = {"encoder": {"@misc": ray_encoder.ENCODER}}
    nlp.add_pipe("concept_normalizer", config=config).initialize(nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt"))
    path = tmp_path_factory.mktemp("annotate_ray") / "pipeline"
    nlp.to_disk(path)
    return path


def doc_id(i: int) -> object:
    return i if i % 3 == 0 else f"d{i}"  # every third id an integer


def write_input(path: Path, n: int = 30) -> Path:
    """n documents (the texts in turn), a malformed line at line 5 and a duplicate id at line 10."""
    lines = [json.dumps({"id": doc_id(i), "text": TEXTS[i % len(TEXTS)]}) for i in range(n)]
    lines.insert(4, '{"id": "broken", "text": ')
    lines.insert(9, json.dumps({"id": "d1", "text": "a duplicate id"}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_same_records_as_the_local_engine(local_ray, pipeline_dir, tmp_path):
    source = write_input(tmp_path / "in.jsonl")
    long_text = " ".join(f"Case {n} had breast cancer.\nAnd phenylketonuria." for n in range(6))
    source.write_text(source.read_text("utf-8") + json.dumps({"id": "long", "text": long_text}) + "\n", "utf-8")
    with pytest.warns(UserWarning):
        local = annotate(
            pipeline_dir, source, tmp_path / "local.jsonl", include_text=True, max_length=80, progress=False
        )
    with pytest.warns(UserWarning) as caught:
        summary = annotate_ray(
            pipeline_dir, source, tmp_path / "ray.jsonl", shard_size=4, batch_size=3, include_text=True,
            max_length=80, progress=False,
        )  # fmt: skip
    messages = [str(w.message) for w in caught]
    assert any(f"{source}:5: invalid JSON" in m for m in messages), messages
    assert any(f"{source}:10: duplicate id 'd1'" in m for m in messages), messages
    assert any(f"Document 'long' has {len(long_text)} characters" in m and "in 5 pieces" in m for m in messages), (
        messages
    )
    records = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text(encoding="utf-8").splitlines()]
    expected = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [doc_id(i) for i in range(30)] + ["long"]  # in order, integers kept
    assert records == expected  # the same ids, texts and entities
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    assert [(e["text"], e["concept_id"]) for e in records[1]["entities"]] == [
        ("breast and ovarian cancer", "D001943|D010051")
    ]
    assert [e["start"] for e in records[-1]["entities"]][-2:] == [long_text.rfind("breast"), long_text.rfind("phen")]
    assert (summary.written, summary.malformed, summary.duplicates) == (31, 1, 1)
    assert summary.entities == local.entities == 42 and (summary.shards, summary.actors) == (8, 2)
    assert not parts_dir(tmp_path / "ray.jsonl").exists()


@pytest.mark.slow
def test_resume_skips_the_finished_shards(local_ray, pipeline_dir, tmp_path, monkeypatch):
    """An interrupted run as it is left on disk: OUTPUT as before the run (here one record, of an earlier run),
    three shards listed in the manifest (one of them cut short since), one part file not listed yet."""
    source = write_input(tmp_path / "in.jsonl")
    with pytest.warns(UserWarning):
        annotate(pipeline_dir, source, tmp_path / "local.jsonl", progress=False)
    lines = (tmp_path / "local.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_text(lines[0], encoding="utf-8")
    parts = parts_dir(out)
    manifest = ray_engine.Manifest(parts, {"output_format": "jsonl", "include_text": False, "shard_size": 4})
    shards = [lines[1 + 4 * k : 5 + 4 * k] for k in range(8)]  # 29 documents after the one in OUTPUT
    for k in (0, 3, 5, 6):
        records = [json.loads(line) for line in shards[k]]
        if k == 3:  # marked: a shard that is skipped reaches OUTPUT as it is on disk, it is not annotated again
            records = [{**r, "resumed": True} for r in records]
        data = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
        (parts / f"part-{k:05d}.jsonl").parent.mkdir(exist_ok=True)
        (parts / f"part-{k:05d}.jsonl").write_bytes(data[:-3] if k == 0 else data)  # 0: cut short since
        if k != 6:  # 6: written, the run killed before the manifest listed it
            digest = ray_engine.ids_digest(json.dumps(r["id"]) for r in records)
            entry = {"file": f"part-{k:05d}.jsonl", "documents": len(records), "ids_sha256": digest, "bytes": len(data)}
            manifest.add(k, entry)

    with pytest.warns(UserWarning):
        summary = annotate_ray(pipeline_dir, source, out, shard_size=4, concurrency=1, progress=False)
    result = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in result if r.pop("resumed", False)] == [json.loads(line)["id"] for line in shards[3]]
    assert result == [json.loads(line) for line in lines]  # nothing lost, nothing twice, in input order
    assert (summary.shards, summary.shards_done_before, summary.written, summary.skipped) == (8, 2, 21, 9)
    assert not parts.exists()

    monkeypatch.setattr(ray_engine, "ray_session", None)  # finished: nothing to do, Ray is not even called
    with pytest.warns(UserWarning):
        summary = annotate_ray(pipeline_dir, source, out, shard_size=4, progress=False)
    assert (summary.written, summary.skipped, summary.shards) == (0, 30, 0)


KILLED_DRIVER = """
import sys
import ray
from spacy_conceptnorm.annotate import annotate_ray
from tests import ray_encoder
hook = {"worker_process_setup_hook": "tests.ray_encoder.register", "env_vars": {"PYTHONPATH": sys.argv[4]}}
ray.init(num_cpus=2, include_dashboard=False, runtime_env=hook)
annotate_ray(sys.argv[1], sys.argv[2], sys.argv[3], shard_size=3, concurrency=2, progress=False)
"""


@pytest.mark.slow
def test_killed_by_sigkill_then_resumed_gives_the_records_of_an_uninterrupted_run(local_ray, pipeline_dir, tmp_path):
    """A driver of its own Ray instance, killed with SIGKILL once two shards are listed; the same command then
    resumes (on the test's Ray): the local engine's records, nothing lost, nothing twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    nlp = spacy.load(pipeline_dir)
    nlp.add_pipe("test_annotate_ray_slow", first=True)  # 0.25 s a document: 14 shards of 3 take a while
    nlp.to_disk(tmp_path / "slow")
    source = write_input(tmp_path / "in.jsonl", 40)
    with pytest.warns(UserWarning):
        annotate(pipeline_dir, source, tmp_path / "local.jsonl", progress=False)
    out, root = tmp_path / "out.jsonl", str(Path(__file__).parents[1])
    args = [sys.executable, "-c", KILLED_DRIVER, str(tmp_path / "slow"), str(source), str(out), root]
    driver = subprocess.Popen(args, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest, deadline = parts_dir(out) / "manifest.json", time.monotonic() + 240
    try:
        while not (manifest.exists() and len(json.loads(manifest.read_text("utf-8") or "{}").get("shards", {})) >= 2):
            assert driver.poll() is None and time.monotonic() < deadline, "no two shards finished"
            time.sleep(0.2)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    assert not out.exists() or out.read_bytes() == b""  # killed mid-run: the records reach OUTPUT at the end
    with pytest.warns(UserWarning):  # the malformed line and the duplicate id, as in every run
        summary = annotate_ray(tmp_path / "slow", source, out, shard_size=3, concurrency=2, progress=False)
    assert summary.shards_done_before >= 2
    assert out.read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    assert not parts_dir(out).exists()


def test_manifest_with_other_settings_or_unreadable(tmp_path):
    parts = tmp_path / "out.jsonl.parts"
    settings = {"output_format": "jsonl", "include_text": False, "shard_size": 4}
    parts.mkdir()
    (parts / "part-00000.jsonl").write_text('{"id": "a", "entities": []}\n', encoding="utf-8")
    entry = {"file": "part-00000.jsonl", "documents": 1, "ids_sha256": "x", "bytes": 28}
    ray_engine.Manifest(parts, settings).add(0, entry)
    assert ray_engine.Manifest(parts, settings).is_done(0, "part-00000.jsonl", "x", 1)
    assert not ray_engine.Manifest(parts, settings).is_done(0, "part-00000.jsonl", "y", 1)  # other ids
    assert not ray_engine.Manifest(parts, settings).is_done(0, "part-00000.jsonl", "x", 2)  # other count
    assert not ray_engine.Manifest(parts, settings).is_done(1, "part-00001.jsonl", "x", 1)  # not listed
    with pytest.warns(UserWarning, match=r"W990.*shard_size 4 -> 8"):
        assert not ray_engine.Manifest(parts, {**settings, "shard_size": 8}).is_done(0, "part-00000.jsonl", "x", 1)
    (parts / "part-00000.jsonl").write_text('{"id": "a", "entities": [1]}\n', encoding="utf-8")  # changed since
    assert not ray_engine.Manifest(parts, settings).is_done(0, "part-00000.jsonl", "x", 1)
    for broken in ("{not json", "[1, 2]", '{"format": 99, "output_format": "jsonl"}'):
        (parts / "manifest.json").write_text(broken, encoding="utf-8")
        with pytest.raises(ConceptNormError, match="E991"):
            ray_engine.Manifest(parts, settings)


@pytest.mark.slow
def test_cli_a_failing_actor_then_the_resume(local_ray, pipeline_dir, tmp_path):
    """An exception in an actor ends the run (E994, the cause named) with the finished shards kept; once the cause
    is gone the same command finishes the rest."""
    nlp = spacy.load(pipeline_dir)
    nlp.add_pipe("test_annotate_ray_fail", first=True)
    nlp.to_disk(tmp_path / "failing")
    flag = tmp_path / "flag"
    flag.touch()
    source = write_input(tmp_path / "in.jsonl", 12)
    with source.open("a", encoding="utf-8") as f:  # alone in the last shard, which fails
        f.write(json.dumps({"id": "fail", "text": f"FAIL {flag}"}) + "\n")
    out = tmp_path / "out.pubtator"
    runner = CliRunner()
    args = ["annotate", str(tmp_path / "failing"), str(source), str(out), "--engine", "ray", "--concurrency", "1"]
    args += ["--shard-size", "3", "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "[E994]" in result.output, result.output
    assert f"ValueError: failing on purpose: FAIL {flag}. The finished shards are kept" in result.output
    assert out.read_bytes() == b"" and len(list(parts_dir(out).glob("part-*.pubtator"))) <= 4

    flag.unlink()
    with pytest.warns(UserWarning):
        annotate(tmp_path / "failing", source, tmp_path / "local.pubtator", progress=False)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == (tmp_path / "local.pubtator").read_bytes()
    assert out.read_text(encoding="utf-8").count("|t|") == 13 and not parts_dir(out).exists()


def test_an_address_that_does_not_answer_is_an_error():
    with pytest.raises(ConceptNormError, match=r"E993.*'127.0.0.1:1'"):
        ray_engine.check_reachable("127.0.0.1:1")  # ray.init would wait for it for ever
    ray_engine.check_reachable("auto")  # Ray's to resolve


def test_cli_options(tmp_path, pipeline_dir):
    source = write_input(tmp_path / "in.jsonl", 3)
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    args = ["annotate", str(pipeline_dir), str(source), str(out), "--engine", "ray"]
    result = runner.invoke(app, [*args, "--n-process", "2"])
    assert result.exit_code == 1 and "--n-process: not an option of --engine ray" in result.output
    result = runner.invoke(app, ["annotate", str(pipeline_dir), str(source), str(out), "--address", "auto"])
    assert result.exit_code == 1 and "--address: not an option of --engine local" in result.output
    result = runner.invoke(app, [*args, "--shard-size", "0"])
    assert result.exit_code == 1 and "shard_size must be an integer >= 1, got 0" in result.output
    result = runner.invoke(app, [*args, "--engine", "spark"])
    assert result.exit_code == 1 and "Unknown engine 'spark'" in result.output
    assert not out.exists()
