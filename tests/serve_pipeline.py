"""The tiny pipeline and annotate output the curation server is tested on (test_serve, test_serve_browser):
entity_ruler + concept_normalizer over the MEDIC sample with the trigram encoder, NIL under confidence 0.9 (so
exact names link and the rest are NIL), and an `annotate` run over a few documents, one with XSS payloads."""

from __future__ import annotations

import json
from pathlib import Path

import spacy
from spacy.util import registry

from spacy_conceptnorm.annotate import annotate
from spacy_conceptnorm.kb.knowledge_base import load_kb

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

IMG_PAYLOAD = "<img src=x onerror=alert(1)> syndrome"
SCRIPT_PAYLOAD = "<script>alert(2)</script>"
DOCS = [
    ("d1", "Familial breast cancer and phenylketonuria were seen."),
    ("d2", "Carriers had zzq syndrome and breast cancer."),
    ("d3", "Another zzq syndrome case, with hemochromatosis."),
    ("x<1>", f"A {IMG_PAYLOAD} was noted. Then {SCRIPT_PAYLOAD} too."),
]
PATTERNS = ["breast cancer", "phenylketonuria", "zzq syndrome", "hemochromatosis", IMG_PAYLOAD, SCRIPT_PAYLOAD]
BREAST_CANCER = "D001943"


class SavedTrigramEncoder(TrigramEncoder):
    def config(self) -> dict:
        return {}  # nothing to save: the loaded pipeline makes its encoder from the config below


@registry.misc("test_serve.trigram_encoder.v1")
def make_trigram_encoder() -> TrigramEncoder:
    return SavedTrigramEncoder()


def build_pipeline(path: Path) -> Path:
    """Save the pipeline to `path`."""
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns([{"label": "Disease", "pattern": p} for p in PATTERNS])
    config = {"encoder": {"@misc": "test_serve.trigram_encoder.v1"}, "nil_threshold": 0.9}
    nlp.add_pipe("concept_normalizer", config=config).initialize(nlp=nlp, kb=load_kb(FIXTURES / "medic_sample.txt"))
    nlp.to_disk(path)
    return path


def write_annotations(pipeline: Path, directory: Path) -> Path:
    """Annotate DOCS (with their texts) into directory/out.jsonl."""
    source = directory / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS), encoding="utf-8")
    annotate(pipeline, source, directory / "out.jsonl", include_text=True, progress=False)
    return directory / "out.jsonl"
