"""`BNEEncoder`: the trained BNE network behind the name-encoder interface (`encode(texts) -> unit vectors`).

A saved encoder is a directory with `config.json` (format tag, network sizes, words and characters) and
`model.safetensors` (the weights, the frozen word vectors included), written atomically. It is selected in a
pipeline config with

    [components.concept_normalizer.encoder]
    @misc = "spacy_conceptnorm.bne_encoder.v1"
    path = "training/bne"
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from spacy.util import registry

from ...errors import ConceptNormError, Errors
from ...io.files import read_json, write_dir_atomically, write_json
from . import inference
from .model import BNE, BNEConfig
from .vocab import Vocab

FORMAT_TAG, FORMAT_VERSION = "spacy_conceptnorm.bne", 1  # the saved format's name, not a module path
CONFIG_FILE, WEIGHTS_FILE, REPORT_FILE = "config.json", "model.safetensors", "training.json"
WORDS_PER_CHUNK = 8192  # distinct words per character-BiLSTM call while encoding
NAMES_PER_CHUNK = 65536  # names tokenized at once while encoding (bounds memory on large term lists)


class BNEEncoder:
    """Encode names into unit vectors with a BNE network (cosine similarity = inner product).

    model (BNE): The network.
    vocab (Vocab): Its words and characters.
    batch_size (int): Names per word-BiLSTM call while encoding (names are grouped by length).
    device (str): "cpu" or "cuda..."; the model is moved there.
    reference (str): Where the encoder was loaded from (shown in reports), or a label.
    """

    def __init__(
        self, model: BNE, vocab: Vocab, batch_size: int = 4096, device: str = "cpu", reference: str = "bne"
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            detail = Errors.E964.format(name="batch_size", expected="a positive integer", value=batch_size)
            raise ConceptNormError(detail)
        self.model = model.to(device)
        self.vocab = vocab
        self.batch_size = batch_size
        self.device = device
        self.reference = reference

    @property
    def dim(self) -> int:
        return self.model.config.out_dim

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Unit vectors (float32, one row per text). The character BiLSTM runs once per distinct word of a chunk,
        the word BiLSTM over names grouped by word count (see `inference`); neither changes a name's vector."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), NAMES_PER_CHUNK)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="Encoding names (BNE)", unit="chunk")
        was_training = self.model.training
        self.model.eval()
        with torch.inference_mode():
            for start in starts:
                chunk = texts[start : start + NAMES_PER_CHUNK]
                vectors[start : start + len(chunk)] = self._encode_chunk(chunk)
        self.model.train(was_training)
        return vectors

    def _encode_chunk(self, texts: Sequence[str]) -> np.ndarray:
        batch = self.vocab.batch(list(texts)).to(self.device)
        word_reps = torch.cat([
            inference.word_representations(self.model, batch, s, s + WORDS_PER_CHUNK)
            for s in range(0, len(batch.word_ids), WORDS_PER_CHUNK)
        ])  # fmt: skip
        tables = inference.word_tables(self.model, word_reps)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = torch.argsort(batch.lengths, stable=True)
        for s in range(0, len(texts), self.batch_size):
            idx = order[s : s + self.batch_size]
            emb = inference.pool_names(self.model, tables, batch.tokens[idx.to(self.device)], batch.lengths[idx])
            out[idx.numpy()] = torch.nn.functional.normalize(emb.float(), dim=-1).cpu().numpy()
        return out

    # --- saving and loading -------------------------------------------------------------------------------------
    def config(self) -> dict:
        return {"model": self.reference, "batch_size": self.batch_size}

    def save(self, path: str | Path, report: dict | None = None) -> None:
        """Write the encoder as a directory, atomically: a failed write leaves the previous one in place.

        path (Path): The directory.
        report (dict): A training report to write beside the weights as `training.json`.
        """
        write_dir_atomically(path, lambda tmp: self._write(tmp, report))

    def _write(self, path: Path, report: dict | None = None) -> None:
        if report is not None:
            write_json(path / REPORT_FILE, report)
        write_json(
            path / CONFIG_FILE,
            {
                "format": FORMAT_TAG,
                "version": FORMAT_VERSION,
                "network": self.model.config.to_dict(),
                "vocab": self.vocab.to_dict(),
            },
        )
        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(path / WEIGHTS_FILE), metadata={"format": FORMAT_TAG})
        (path / WEIGHTS_FILE).chmod((path / CONFIG_FILE).stat().st_mode)  # safetensors writes owner-only files

    @classmethod
    def load(cls, path: str | Path, batch_size: int = 4096, device: str = "cpu") -> BNEEncoder:
        """Read a directory written by `save`; a missing, corrupt or mismatched file raises ConceptNormError
        naming it."""
        path = Path(path)
        config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
        for file in (config_path, weights_path):
            if not file.is_file():
                raise ConceptNormError(Errors.E960.format(path=file, detail="is missing"))
        data = read_json(config_path)
        if data.get("format") != FORMAT_TAG or data.get("version") != FORMAT_VERSION:
            found = f"{data.get('format')}/{data.get('version')}"
            raise ConceptNormError(Errors.E960.format(path=config_path, detail=f"has format {found!r}"))
        try:
            config = BNEConfig(**data["network"])
            vocab = Vocab.from_dict(data["vocab"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E960.format(path=config_path, detail=f"is malformed ({e!r})")) from None
        try:
            state = load_file(str(weights_path))
        except (SafetensorError, OSError, ValueError) as e:
            raise ConceptNormError(Errors.E960.format(path=weights_path, detail=f"is corrupt ({e})")) from None
        try:
            model = BNE(config, state["words.weight"])
            model.load_state_dict(state, strict=True)
        except (KeyError, RuntimeError) as e:
            detail = f"does not match {config_path.name} ({type(e).__name__}: {str(e)[:200]})"
            raise ConceptNormError(Errors.E960.format(path=weights_path, detail=detail)) from None
        return cls(model.eval(), vocab, batch_size=batch_size, device=device, reference=str(path))


@registry.misc("spacy_conceptnorm.bne_encoder.v1")
def make_bne_encoder(path: str, batch_size: int = 4096, device: str = "cpu") -> BNEEncoder:
    """A trained BNE encoder from its directory (written by `train-bne`).

    path (str): The directory.
    batch_size (int): Names per word-BiLSTM call.
    device (str): "cpu" or "cuda".
    """
    return BNEEncoder.load(path, batch_size=batch_size, device=device)
