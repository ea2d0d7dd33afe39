"""The curation page end to end in a real headless browser: Playwright for Python driving the system's Chromium
(Debian's `chromium` package; Playwright's own browser download is not needed). It opens the page with a token,
checks that the XSS payloads in mentions show as text and never run, accepts a link, adds a synonym, and sees the
other mention of that text re-linked.

Skips only where no Chromium executable can be found (CHROMIUM_PATH, or chromium / chromium-browser /
google-chrome on PATH) or Playwright is not installed. Set SERVE_SCREENSHOT=path to keep a screenshot there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra (fastapi, uvicorn) is not installed")

from spacy_conceptnorm.serve import load_curation  # noqa: E402
from spacy_conceptnorm.serve.app import create_app  # noqa: E402

from .serve_pipeline import BREAST_CANCER, IMG_PAYLOAD, SCRIPT_PAYLOAD, build_pipeline, write_annotations  # noqa: E402

TOKEN = "browser-test-token"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """A Chromium executable: $CHROMIUM_PATH, one on PATH, or Debian's binary."""
    found = [os.environ.get("CHROMIUM_PATH"), *(shutil.which(n) for n in CANDIDATES), "/usr/lib/chromium/chromium"]
    return next((p for p in found if p and os.access(p, os.X_OK)), None)


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium executable found (apt-get install -y chromium, or set CHROMIUM_PATH)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """The curation app on a real port (uvicorn in a thread), as `serve` runs it."""
    pipeline = build_pipeline(tmp_path / "pipeline")
    out = write_annotations(pipeline, tmp_path)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    records[0]["entities"][0]["assertion"] = "negated"  # as a pipeline ending with clinical_context writes it
    out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    curation = load_curation(pipeline, out, nil_method="text")
    port = free_port()
    app = create_app(curation, token=TOKEN, allowed_hosts=["127.0.0.1", "localhost"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", out
    server.should_exit = True
    thread.join(10)


def row(page, mention_id: int):
    return page.locator(f'#mentions article[data-id="{mention_id}"]')


def test_accept_add_synonym_and_see_the_relinked_mention(server, tmp_path):
    url, out = server
    dialogs = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/#token={TOKEN}")
            page.wait_for_selector("body[data-ready='1']", timeout=15_000)
            assert "token" not in page.url  # the fragment is cleared once read

            # XSS: the payloads show as text; no element, no dialog, no script from them
            assert row(page, 6).locator(".context mark").text_content() == IMG_PAYLOAD
            assert row(page, 7).locator(".context mark").text_content() == SCRIPT_PAYLOAD
            assert page.locator("#mentions img, #mentions script").count() == 0

            # the assertion status shows where the output has one
            assert row(page, 0).locator(".badge.assertion").text_content() == "negated"
            assert row(page, 1).locator(".badge.assertion").count() == 0

            # accept a link
            row(page, 0).locator("button[data-action='accept']").click()
            page.wait_for_selector('#mentions article[data-id="0"].status-accepted')
            assert "accept" in page.locator("#notice").text_content()

            # search the KB from a NIL mention and add the mention as a synonym of what was found
            zzq = row(page, 2)
            assert zzq.locator(".link .cid").text_content() == "NIL"
            assert row(page, 4).locator(".link .cid").text_content() == "NIL"
            zzq.locator(".search input").fill("breast neoplasm")
            zzq.locator("button[data-action='search']").click()
            found = zzq.locator(".results li", has_text=BREAST_CANCER).first
            found.locator("button[data-action='synonym']").click()

            # the other mention of the same text is re-linked at once, and shown so
            page.wait_for_selector('#mentions article[data-id="4"].relinked')
            other = row(page, 4)
            assert other.locator(".link .cid").text_content() == BREAST_CANCER
            assert other.locator(".relinked-badge").is_visible()
            assert row(page, 2).locator(".badge.status").text_content() == "synonym"
            assert "re-linked" in page.locator("#notice").text_content()
            assert "2 of 8 mentions reviewed" in page.locator("#stats").text_content()
            screenshot = Path(os.environ.get("SERVE_SCREENSHOT") or tmp_path / "curation.png")
            page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 10_000
            assert not dialogs and not errors  # no alert() from the payloads, no script error
        finally:
            browser.close()
    logged = [json.loads(line) for line in out.with_suffix(".reviews.jsonl").read_text().splitlines()]
    assert [(e["action"], e["text"], e["concept_id"]) for e in logged] == [
        ("accept", "breast cancer", BREAST_CANCER),
        ("synonym", "zzq syndrome", BREAST_CANCER),
    ]
