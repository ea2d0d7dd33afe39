"""Take docs/curation.png: the curation page over the NCBI-disease samples of tests/fixtures.

    HF_HUB_OFFLINE=1 python docs/make_screenshot.py [docs/curation.png]

An entity_ruler of the samples' gold mention texts and a concept_normalizer (the packaged MiniLM) over the MEDIC
sample annotate the abstracts. In headless Chromium (Debian's `chromium`) the mentions of one abstract are listed,
a NIL mention gets its gold concept from a KB search ("Choose"), and the worst, an abbreviation the abstract
defines, is made a synonym of its gold concept ("+ synonym": its other mentions are re-linked in place); then the
page is shot.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import spacy
import uvicorn
from playwright.sync_api import sync_playwright

from spacy_conceptnorm.annotate import annotate, read_pubtator
from spacy_conceptnorm.io.corpus import read_pubtator as read_gold
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.serve import Filters, load_curation
from spacy_conceptnorm.serve.app import create_app

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures"
SAMPLES = [FIXTURES / "ncbi_test_sample.txt", FIXTURES / "ncbi_train_sample.txt"]
DOC = "9949209"  # copper toxicosis in Bedlington terriers: "CT" five times, NIL


def main(target: Path) -> None:
    nlp = spacy.blank("en")
    gold_docs = [doc for path in SAMPLES for doc in read_gold(path)]
    patterns = sorted({a.text for doc in gold_docs for a in doc.annotations})
    nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"}).add_patterns(
        [{"label": "Disease", "pattern": p} for p in patterns]
    )
    normalizer = nlp.add_pipe("concept_normalizer", config={"nil_threshold": 0.8})
    normalizer.initialize(nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt"))
    gold = {(d.pmid, a.start, a.end): a.id for d in gold_docs for a in d.annotations}
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        records = [(i, t) for path in SAMPLES for _, i, t in read_pubtator(path, lambda *a: None)]
        source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in records), encoding="utf-8")
        annotate(nlp, source, out, include_text=True, progress=False)
        curation = load_curation(nlp, out, nil_method="text")
        rows = curation.page(Filters(document=DOC), 0, 100)["rows"]
        kb = normalizer.kb

        def gold_of(row: dict) -> str | None:
            return kb.resolve(gold[(DOC, row["start"], row["end"])])

        worst = rows[0]  # an abbreviation the abstract defines: a synonym of its gold concept for this corpus
        other = next(r for r in rows if r["link"]["nil"] and r["text"] != worst["text"] and gold_of(r))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(create_app(curation), host="127.0.0.1", port=port, log_level="error"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/lib/chromium/chromium"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("body[data-ready='1']")
            page.fill("#filters input[name=document]", DOC)
            page.click("#filters button[type=submit]")
            for row, action in ((other, "choose"), (worst, "synonym")):
                article = page.locator(f'#mentions article[data-id="{row["id"]}"]')
                article.locator(".search input").fill(kb.concepts[gold_of(row)].canonical_name)
                article.locator("button[data-action='search']").click()
                article.locator(".results li", has_text=gold_of(row)).locator(f"button[data-action='{action}']").click()
            page.wait_for_selector(f'#mentions article[data-id="{other["id"]}"].status-changed')
            page.wait_for_selector("#mentions article.relinked:not(.status-synonym)")
            page.evaluate("window.scrollTo(0, 0)")
            time.sleep(1.5)  # the changed rows' highlight fades
            page.screenshot(path=str(target))
            browser.close()
        server.should_exit = True
    print(f"{len(records)} documents, {len(curation.mentions)} mentions -> {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "curation.png"))
