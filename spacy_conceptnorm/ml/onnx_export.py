"""The name encoder as an ONNX graph run by ONNX Runtime (`NameEncoder(runtime="onnx")`, the `onnx` extra).

The exported graph takes `input_ids` and `attention_mask` (batch and tokens both dynamic) and returns the pooled,
L2-normalized vectors, so ONNX Runtime does the pooling too. Exporting a model takes seconds (transformers and
the `onnx` package are needed then), so exports are cached: `<cache>/<key>.onnx`, where the cache is
`$XDG_CACHE_HOME/spacy_conceptnorm/onnx` (default `~/.cache/...`) and the key is the sha256 of the model
directory's files, the pooling and the export settings; a model given by hub id is keyed by its id. Only ONNX
Runtime is needed to run a cached export.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open

EXPORT_VERSION = 1  # bump when the exported graph changes: old cache entries are then no longer found
OPSET = 17
INPUTS = ("input_ids", "attention_mask")


def cache_dir() -> Path:
    """Where exports are kept: $XDG_CACHE_HOME/spacy_conceptnorm/onnx, by default ~/.cache/spacy_conceptnorm/onnx."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spacy_conceptnorm" / "onnx"


def require_onnxruntime():
    """The onnxruntime module, or ConceptNormError naming the extra to install."""
    try:
        import onnxruntime
    except ImportError as e:
        raise ConceptNormError(Errors.E131.format(module="onnxruntime", detail=e)) from None
    return onnxruntime


def export_key(model: str, pooling: str) -> str:
    """The cache key of a model's export: the sha256 of its directory's files (names and contents) or of its hub
    id, with the pooling and the export settings."""
    digest = hashlib.sha256(f"{EXPORT_VERSION}|{OPSET}|{pooling}".encode())
    path = Path(model)
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
            with open(file, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    else:
        digest.update(f"hub:{model}".encode())
    return digest.hexdigest()


class _Pooled(torch.nn.Module):
    """A transformers encoder with the pooling and normalization of `NameEncoder` on top (what is exported)."""

    def __init__(self, model: torch.nn.Module, pooling: str) -> None:
        super().__init__()
        self.model = model
        self.pooling = pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            pooled = out[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def export(model: str, pooling: str, path: Path) -> None:
    """Export the transformers model at `model` (a directory or hub id) with its pooling to `path` (atomically)."""
    try:
        import onnx  # noqa: F401 (torch's exporter needs it)
    except ImportError as e:
        raise ConceptNormError(Errors.E131.format(module="onnx", detail=e)) from None
    from transformers import AutoModel

    # The eager attention builds its mask from `attention_mask` in every case; the traced SDPA path may decide
    # from the example input that no mask is needed.
    encoder = AutoModel.from_pretrained(model, attn_implementation="eager").eval()
    example = {
        "input_ids": torch.tensor([[101, 2000, 2001, 102], [101, 2000, 102, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }
    dynamic = {name: {0: "batch", 1: "tokens"} for name in INPUTS} | {"vectors": {0: "batch"}}
    buffer = io.BytesIO()
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            _Pooled(encoder, pooling),
            (example["input_ids"], example["attention_mask"]),
            buffer,
            input_names=list(INPUTS),
            output_names=["vectors"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
    with atomic_open(path) as f:
        f.write(buffer.getvalue())


def cached_export(model: str, pooling: str) -> Path:
    """The path of the model's export, exported first unless the cache has it."""
    path = cache_dir() / f"{export_key(model, pooling)}.onnx"
    if not path.exists():
        export(model, pooling, path)
    return path


def open_session(path: Path, threads: int, device: str):
    """An ONNX Runtime session on an export: all graph optimizations, `threads` intra-op threads, which sleep
    instead of spinning between calls unless OMP_WAIT_POLICY is ACTIVE (spinning threads wait on threads that are
    not scheduled when the machine is shared, see `threads`), on CUDA when `device` is and the CUDA provider is
    installed, else on the CPU."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "ACTIVE":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = ["CPUExecutionProvider"]
    if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # onnxruntime raises its own types for an unreadable or truncated file
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
