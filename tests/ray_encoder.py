"""The trigram encoder and a failing and a slow component registered for the pipelines of test_annotate_ray, in a
module of its own: every Ray worker of that test imports it at start (runtime_env worker_process_setup_hook), as an
installed package's entry point would be on a real cluster, so it imports as little as it can."""

import time
from pathlib import Path

from spacy.language import Language
from spacy.util import registry

from .fake_encoder import TrigramEncoder

ENCODER = "test_annotate_ray.trigram_encoder.v1"


class SavedTrigramEncoder(TrigramEncoder):
    def config(self) -> dict:
        return {}  # nothing to save: the loaded pipeline makes its encoder from the config


@registry.misc(ENCODER)
def make_trigram_encoder() -> TrigramEncoder:
    return SavedTrigramEncoder()


@Language.component("test_annotate_ray_fail")
def fail(doc):
    """Fails on a document "FAIL <path>" while the file <path> exists (a failure that the test can then fix)."""
    if doc.text.startswith("FAIL ") and Path(doc.text[5:]).exists():
        raise ValueError(f"failing on purpose: {doc.text}")
    return doc


@Language.component("test_annotate_ray_slow")
def slow(doc):
    """A quarter of a second a document: a run long enough to be killed between its shards."""
    time.sleep(0.25)
    return doc


def register() -> None:
    """The setup hook: importing this module was the work."""
