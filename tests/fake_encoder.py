"""A deterministic stand-in for the transformer: hashed character trigrams. It lets the search logic be tested
in milliseconds; the real encoder is exercised by test_component.py (the packaged MiniLM) and test_lazy.py."""

import zlib

import numpy as np


class TrigramEncoder:
    reference = "trigram-test-encoder"
    device = "cpu"
    dim = 64

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, texts, progress=False):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            padded = f"  {text} "
            for j in range(len(padded) - 2):
                out[i, zlib.crc32(padded[j : j + 3].encode()) % self.dim] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True).clip(min=1e-12)

    def encode_queries(self, texts):
        """Each text's vector depends on it alone already (a subclass that is also a NameEncoder keeps this)."""
        return self.encode(texts)

    def config(self):
        return {"model": self.reference}
