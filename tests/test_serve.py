"""The curation server's API (FastAPI's TestClient): the list, the decisions and undo, synonyms that re-link at
once, the reviews and synonyms files across restarts and crashes, NIL groups, and its security."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import spacy

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
httpx = pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")

with warnings.catch_warnings():  # newer starlette prefers httpx2 and warns when it falls back to httpx
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from spacy_conceptnorm.cli import app as cli_app  # noqa: E402
from spacy_conceptnorm.errors import ConceptNormError  # noqa: E402
from spacy_conceptnorm.serve import apply_synonyms, load_curation, read_annotations, read_synonyms  # noqa: E402
from spacy_conceptnorm.serve.app import STATIC, check_bind, create_app  # noqa: E402

from .serve_pipeline import (  # noqa: E402
    BREAST_CANCER,
    DOCS,
    IMG_PAYLOAD,
    SCRIPT_PAYLOAD,
    build_pipeline,
    write_annotations,
)

ZZQ = [2, 4]  # the two "zzq syndrome" mentions (NIL: no name is close)


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory) -> Path:
    return build_pipeline(tmp_path_factory.mktemp("serve") / "pipeline")


@pytest.fixture(scope="module")
def annotations_file(pipeline_dir, tmp_path_factory) -> Path:
    return write_annotations(pipeline_dir, tmp_path_factory.mktemp("annotated"))


@pytest.fixture
def out(annotations_file, tmp_path) -> Path:
    """A fresh copy of the annotate output: its reviews and synonyms files land beside it."""
    return Path(shutil.copy(annotations_file, tmp_path / "out.jsonl"))


@pytest.fixture
def session(pipeline_dir, out, tmp_path):
    curation = load_curation(pipeline_dir, out, save_dir=tmp_path / "saved", nil_method="text")
    return curation, TestClient(create_app(curation))


def reviews(out: Path) -> list[dict]:
    path = out.with_suffix(".reviews.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def link(nlp, text: str) -> str:
    """The concept the pipeline links a mention text to (in a sentence the entity_ruler finds it in)."""
    normalizer = nlp.get_pipe("concept_normalizer")
    (match,) = normalizer.linker.link([text])
    return match.candidates[0][0] if match.confidence >= normalizer.cfg["nil_threshold"] else "NIL"


def test_list_is_worst_first_with_context_and_candidates(session):
    _, client = session
    data = client.get("/api/mentions").json()
    rows = data["rows"]
    assert data["total"] == len(rows) == 8
    nil = [r for r in rows if r["link"]["nil"]]
    assert rows[: len(nil)] == nil and len(nil) == 4  # NIL first
    confidences = [r["link"]["confidence"] for r in nil]
    assert confidences == sorted(confidences)  # then the lowest confidence first
    assert {r["text"] for r in rows[len(nil) :]} == {"breast cancer", "phenylketonuria", "hemochromatosis"}
    row = next(r for r in rows if r["id"] == 3)
    assert row["doc_id"] == "d2" and row["label"] == "Disease" and row["status"] == "unreviewed"
    assert row["context"] == {"left": "Carriers had zzq syndrome and ", "mention": "breast cancer", "right": ".",
                              "cut_left": False, "cut_right": False}  # fmt: skip
    assert row["link"]["concept_id"] == BREAST_CANCER and row["link"]["concept_name"] == "Breast Neoplasms"
    assert row["link"]["matched"] and row["link"]["confidence"] == 1.0
    zzq = next(r for r in rows if r["id"] == 2)
    assert len(zzq["candidates"]) == 5 and all(c["concept_id"] and c["name"] for c in zzq["candidates"])
    scores = [c["score"] for c in zzq["candidates"]]
    assert scores == sorted(scores, reverse=True) and zzq["link"]["score"] == scores[0]


def test_filters_and_paging(session):
    _, client = session

    def ids(**params) -> list[int]:
        return [r["id"] for r in client.get("/api/mentions", params=params).json()["rows"]]

    everything = ids()
    assert sorted(ids(concept=BREAST_CANCER)) == sorted(ids(concept=f"MESH:{BREAST_CANCER}")) == [0, 3]
    assert sorted(ids(concept="NIL")) == [2, 4, 6, 7]
    assert ids(document="d3") == [i for i in everything if i in (4, 5)]
    assert sorted(ids(q="ZZQ")) == ZZQ
    assert ids(label="Disease") == everything and ids(label="Chemical") == []
    assert ids(offset=2, limit=3) == everything[2:5]
    client.post("/api/mentions/0/decision", json={"action": "accept"})
    assert ids(status="reviewed") == [0] and ids(status="accepted") == [0] and 0 not in ids(status="unreviewed")
    response = client.get("/api/mentions", params={"limit": 1000})
    assert response.status_code == 422 and "limit" in response.json()["error"]
    assert client.get("/api/mentions", params={"status": "bogus"}).status_code == 422


def test_accept_choose_nil_and_undo_are_logged(session, out):
    curation, client = session
    accepted = client.post("/api/mentions/0/decision", json={"action": "accept"}).json()
    assert accepted["rows"][0]["status"] == "accepted" and accepted["rows"][0]["concept_id"] == BREAST_CANCER
    candidate = client.get("/api/mentions/2").json()["candidates"][1]["concept_id"]
    chosen = client.post("/api/mentions/2/decision", json={"action": "choose", "concept_id": candidate}).json()
    assert chosen["rows"][0]["status"] == "changed" and chosen["rows"][0]["concept_id"] == candidate
    marked = client.post("/api/mentions/1/decision", json={"action": "nil"}).json()
    assert marked["rows"][0]["status"] == "nil" and marked["rows"][0]["concept_id"] == "NIL"
    logged = reviews(out)
    assert [(e["seq"], e["action"], e["doc_id"], e["text"], e["concept_id"]) for e in logged] == [
        (1, "accept", "d1", "breast cancer", BREAST_CANCER),
        (2, "choose", "d2", "zzq syndrome", candidate),
        (3, "nil", "d1", "phenylketonuria", "NIL"),
    ]
    assert client.get("/api/info").json()["reviewed"] == 3

    undone = client.post("/api/undo", json={}).json()
    assert undone["undone"]["seq"] == 3 and undone["rows"][0]["status"] == "unreviewed"
    assert client.get("/api/mentions/1").json()["concept_id"] == "D010661"
    client.post("/api/undo", json={})
    client.post("/api/undo", json={})
    assert [e.get("undoes") for e in reviews(out)[3:]] == [3, 2, 1]
    assert client.get("/api/info").json()["reviewed"] == 0
    response = client.post("/api/undo", json={})
    assert response.status_code == 409 and response.json()["error"] == "Nothing to undo."


def test_search_the_kb_and_pick_any_concept(session):
    _, client = session
    results = client.get("/api/search", params={"q": "breast neoplasm"}).json()["results"]
    assert results[0]["concept_id"] == BREAST_CANCER and results[0]["name"] == "Breast Neoplasms"
    by_id = client.get("/api/search", params={"q": "MESH:D006432"}).json()["results"]
    assert by_id[0] == {"concept_id": "D006432", "name": "Hemochromatosis", "matched": None, "score": 1.0}
    picked = client.post("/api/mentions/4/decision", json={"action": "choose", "concept_id": "MESH:D006432"})
    assert picked.json()["rows"][0]["concept_id"] == "D006432"  # any id of the concept, stored as its own
    assert client.get("/api/search", params={"q": ""}).status_code == 422


def test_synonym_relinks_the_same_text_at_once_and_undo_removes_it(session, out):
    curation, client = session
    nlp = curation.nlp
    assert link(nlp, "zzq syndrome") == "NIL"
    result = client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER}).json()
    assert result["event"]["action"] == "synonym" and result["event"]["new"] is True
    rows = {r["id"]: r for r in result["rows"]}
    assert sorted(rows) == ZZQ and result["rows"][0]["id"] == 2  # the mention first, then the re-linked one
    for row in rows.values():
        assert row["relinked"] and row["link"]["concept_id"] == BREAST_CANCER and row["original_concept_id"] == "NIL"
        assert row["link"]["confidence"] == 1.0 and row["concept_id"] == BREAST_CANCER
    assert rows[2]["status"] == "synonym" and rows[4]["status"] == "unreviewed"
    assert link(nlp, "zzq syndrome") == BREAST_CANCER  # the linker answers with it at once
    assert [e.kb_id_ for e in nlp("More zzq syndrome.").ents] == [BREAST_CANCER]  # and so does the pipeline
    assert list(read_synonyms(out.with_suffix(".synonyms.jsonl"))) == [("zzq syndrome", BREAST_CANCER)]
    assert sorted(r["id"] for r in client.get("/api/mentions", params={"concept": BREAST_CANCER}).json()["rows"]) == [
        0, 2, 3, 4
    ]  # fmt: skip

    undone = client.post("/api/undo", json={}).json()
    assert undone["undone"]["action"] == "synonym"
    assert {r["id"]: (r["relinked"], r["link"]["concept_id"]) for r in undone["rows"]} == {
        2: (False, "NIL"), 4: (False, "NIL")
    }  # fmt: skip
    assert link(nlp, "zzq syndrome") == "NIL"
    assert list(read_synonyms(out.with_suffix(".synonyms.jsonl"))) == []


def test_undo_keeps_a_synonym_that_was_there_before(session):
    curation, client = session
    curation.normalizer.add_synonyms([("zzq syndrome", BREAST_CANCER)])
    result = client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER}).json()
    assert result["event"]["new"] is False
    client.post("/api/undo", json={})
    assert link(curation.nlp, "zzq syndrome") == BREAST_CANCER
    curation.normalizer.remove_synonyms([("zzq syndrome", BREAST_CANCER)])
    assert link(curation.nlp, "zzq syndrome") == "NIL"  # the page's add and undo left no extra count behind


def test_decisions_and_synonyms_survive_a_restart(pipeline_dir, out, session):
    _, client = session
    client.post("/api/mentions/0/decision", json={"action": "accept"})
    client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER})
    client.post("/api/mentions/5/decision", json={"action": "nil"})
    client.post("/api/undo", json={})  # the NIL

    restarted = load_curation(pipeline_dir, out, nil_method="text")  # a fresh pipeline from disk
    assert link(restarted.nlp, "zzq syndrome") == BREAST_CANCER
    rows = {r["id"]: r for r in restarted.rows(list(range(8)))}
    assert rows[0]["status"] == "accepted" and rows[2]["status"] == "synonym" and rows[5]["status"] == "unreviewed"
    assert rows[4]["relinked"] and rows[4]["link"]["concept_id"] == BREAST_CANCER
    assert restarted.undo()["undone"]["action"] == "synonym"  # the undo stack is rebuilt too
    assert link(restarted.nlp, "zzq syndrome") == "NIL"
    assert restarted.undo()["undone"]["action"] == "accept"


def test_a_torn_review_line_is_cut_off_with_a_warning(pipeline_dir, out, session):
    _, client = session
    client.post("/api/mentions/0/decision", json={"action": "accept"})
    path = out.with_suffix(".reviews.jsonl")
    complete = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"seq": 2, "action": "ni')  # the server killed mid-write
    with pytest.warns(UserWarning, match="W971"):
        restarted = load_curation(pipeline_dir, out, nil_method="text")
    assert path.read_bytes() == complete
    restarted.decide(1, "nil")
    assert [e["seq"] for e in reviews(out)] == [1, 2] and restarted.status(0) == "accepted"


def test_annotations_torn_last_line_skipped_and_bad_lines_refused(annotations_file, tmp_path):
    lines = annotations_file.read_text(encoding="utf-8").splitlines(keepends=True)
    torn = tmp_path / "torn.jsonl"
    torn.write_text("".join(lines[:-1]) + lines[-1][:30], encoding="utf-8")
    with pytest.warns(UserWarning, match="W970"):
        annotations = read_annotations(torn)
    assert annotations.doc_ids == ["d1", "d2", "d3"] and len(annotations.mentions) == 6
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + '{"id": "z", "entities": 3}\n' + lines[1], encoding="utf-8")
    with pytest.raises(ConceptNormError, match=r"E971.*bad.jsonl:2"):
        read_annotations(bad)


def test_texts_from_the_annotate_input(pipeline_dir, annotations_file, tmp_path):
    lean = tmp_path / "lean.jsonl"
    records = [json.loads(line) for line in annotations_file.read_text(encoding="utf-8").splitlines()]
    lean.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "text"}) + "\n" for r in records))
    assert read_annotations(lean).texts == [""] * 4
    source = annotations_file.parent / "in.jsonl"
    assert read_annotations(lean, documents=source).texts == [t for _, t in DOCS]
    curation = load_curation(pipeline_dir, lean, nil_method="text")
    assert curation.row(0)["context"] is None  # no text: the mention alone


def test_saved_pipeline_and_synonyms_file_include_the_synonyms(session, out, pipeline_dir, tmp_path):
    _, client = session
    client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER})
    saved = client.post("/api/pipeline/save", json={}).json()["path"]
    assert link(spacy.load(saved), "zzq syndrome") == BREAST_CANCER
    fresh = spacy.load(pipeline_dir)
    assert link(fresh, "zzq syndrome") == "NIL"
    assert apply_synonyms(fresh, out.with_suffix(".synonyms.jsonl")) == []
    assert link(fresh, "zzq syndrome") == BREAST_CANCER
    unsaved = load_curation(pipeline_dir, out, reviews=tmp_path / "other.jsonl", nil_method="text")
    response = TestClient(create_app(unsaved)).post("/api/pipeline/save", json={})
    assert response.status_code == 409 and "--save-model" in response.json()["error"]


def test_nil_mentions_grouped_by_normalized_text(session):
    _, client = session
    view = client.get("/api/nil-clusters").json()
    assert view["method"] == "text" and view["mentions"] == 4 and view["total"] == 3
    top = view["clusters"][0]
    assert (top["name"], top["size"], top["documents"], sorted(top["mentions"])) == ("zzq syndrome", 2, 2, ZZQ)
    client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER})
    assert [c["name"] for c in client.get("/api/nil-clusters").json()["clusters"]] == sorted(
        [IMG_PAYLOAD, SCRIPT_PAYLOAD]
    )


def test_nil_mentions_clustered_with_coder(pipeline_dir, out):
    curation = load_curation(pipeline_dir, out)  # CODER++ term clustering by default, with the pipeline's encoder
    view = curation.nil_clusters()
    assert view["method"] == "coder" and view["mentions"] == 4
    assert sum(c["size"] for c in view["clusters"]) == 4
    assert any(sorted(c["mentions"]) == ZZQ for c in view["clusters"])
    calls = curation.normalizer.encoder.calls
    before = len(calls)
    curation.decide(1, "nil")
    assert curation.nil_clusters()["mentions"] == 5
    assert calls[before:] == [["phenylketonuria"]]  # only the new NIL text is encoded again


def test_xss_payloads_come_back_as_json_text_never_as_markup(session):
    _, client = session
    response = client.get("/api/mentions", params={"document": "x<1>"})
    assert response.headers["content-type"] == "application/json"
    assert {r["text"] for r in response.json()["rows"]} == {IMG_PAYLOAD, SCRIPT_PAYLOAD}
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html") and "onerror" not in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script  # the page builds elements from text nodes only


def test_request_bodies_are_validated(session):
    _, client = session
    cases = [
        ({"action": "approve"}, "action"),
        ({"action": "choose", "concept_id": 7}, "concept_id"),
        ({"action": "accept", "extra": 1}, "extra"),
        ({"action": "choose", "concept_id": "x" * 201}, "concept_id"),
    ]
    for body, field in cases:
        response = client.post("/api/mentions/0/decision", json=body)
        assert response.status_code == 422 and field in response.json()["error"], body
    response = client.post("/api/mentions/0/decision", json={"action": "choose", "concept_id": "NOPE:1"})
    assert response.status_code == 400 and "Unknown concept id 'NOPE:1'" in response.json()["error"]
    assert client.post("/api/mentions/0/decision", json={"action": "choose"}).status_code == 400
    assert client.post("/api/mentions/99/decision", json={"action": "accept"}).status_code == 404
    assert client.get("/api/mentions/abc").status_code == 422
    assert client.post("/api/mentions/0/synonym", json={}).status_code == 422
    not_json = client.post("/api/mentions/0/decision", content=b"action=nil",
                           headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert not_json.status_code == 415  # a cross-site form cannot post here
    broken = client.post("/api/mentions/0/decision", content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 422
    huge = client.post("/api/mentions/0/decision", json={"action": "nil", "concept_id": "x" * 20_000})
    assert huge.status_code == 413

    def chunks():
        yield b'{"action": "nil", "pad": "'
        for _ in range(20):
            yield b"x" * 1000
        yield b'"}'

    streamed = client.post("/api/mentions/0/decision", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413  # no Content-Length: counted as it arrives
    assert reviews_count(session) == 0


def reviews_count(session) -> int:
    return len(session[0].log.events)


def test_token_and_host_checks(pipeline_dir, out):
    curation = load_curation(pipeline_dir, out, nil_method="text")
    client = TestClient(create_app(curation, token="s3cret", allowed_hosts=["127.0.0.1", "localhost"]),
                        base_url="http://127.0.0.1:8000")  # fmt: skip
    assert client.get("/").status_code == 200  # the page holds no data: served without the token
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/api/info").status_code == 401
    assert client.get("/api/info", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    refused = client.post("/api/mentions/0/decision", json={"action": "nil"})
    assert refused.status_code == 401 and not curation.log.events
    rebound = client.get("/api/info", headers={"Authorization": "Bearer s3cret", "Host": "evil.example:8000"})
    assert rebound.status_code == 400  # DNS rebinding: a page of another site cannot talk to the server

    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", "s3cret")
    for host in ("0.0.0.0", "192.168.1.20", "::"):
        with pytest.raises(ConceptNormError, match="E970"):
            check_bind(host, None)


def test_cli_refuses_another_address_without_a_token(out, monkeypatch):
    monkeypatch.delenv("CONCEPTNORM_TOKEN", raising=False)
    result = CliRunner().invoke(cli_app, ["serve", "no-such-model", "--annotations", str(out), "--host", "0.0.0.0"])
    assert result.exit_code == 1 and "E970" in result.output and "--token" in result.output


def test_the_served_state_survives_a_killed_server(pipeline_dir, out, tmp_path):
    """`serve` in a subprocess, two decisions over HTTP, SIGKILL: a new session has both, and the synonyms file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import tests.serve_pipeline; from spacy_conceptnorm.cli import app; app()"  # registers the encoder
    command = [sys.executable, "-c", code, "serve", str(pipeline_dir), "--annotations", str(out), "--port", str(port)]
    root = Path(__file__).parent.parent
    server = subprocess.Popen(command, cwd=root, env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.get("/api/info").raise_for_status()
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and server.poll() is None, "serve did not start"
                    time.sleep(0.2)
            client.post("/api/mentions/0/decision", json={"action": "accept"}).raise_for_status()
            client.post("/api/mentions/2/synonym", json={"concept_id": BREAST_CANCER}).raise_for_status()
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # no shutdown code runs
        server.wait(30)
    restarted = load_curation(pipeline_dir, out, nil_method="text")
    assert [restarted.status(i) for i in (0, 2, 4)] == ["accepted", "synonym", "unreviewed"]
    assert restarted.row(4)["link"]["concept_id"] == BREAST_CANCER
    assert list(read_synonyms(out.with_suffix(".synonyms.jsonl"))) == [("zzq syndrome", BREAST_CANCER)]
