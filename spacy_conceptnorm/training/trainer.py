"""The training runner: `train(config, output_dir, overrides, resume)`, also `spacy-conceptnorm train`.

Reads a spaCy-style config (`configs/train_xu_bethard.cfg` is the default recipe), builds the training texts
(Train:O or Train:OD), and trains the name encoder on batches from the configured sampler with the configured
loss. Each epoch it measures dev Acc@1, writes `OUTPUT/model-last`, `OUTPUT/model-best` when dev beat every
earlier epoch (the starting model, epoch 0, included), and a checkpoint `OUTPUT/checkpoint` that `resume=True`
continues from (model, optimizer, schedule, random states, history). Every directory is written beside its
target and renamed into place, so an interrupted run leaves the previous complete version. A model directory
is a transformers model that `NameEncoder(path)` loads, with `training.cfg`, `encoder.json` and `metrics.json`
beside the weights.

Speed on CPU: each batch is sorted by token length and encoded in micro-batches padded only to their own
longest name; bf16 autocast where `NameEncoder.autocast_dtype()` allows; `threads` sets torch's threads (0:
torch's, or one when spinning threads meet a busy machine, see `threads.training_threads`; a resumed run keeps
its count).

Dev protocol (`[training.dev]`): the dev mentions are searched with `strategy` (default D-T+OD-T, domain
names from `domain`) as `benchmarks.ncbi` does. With `candidates = 0` every evaluation encodes the whole KB.
With `candidates = N` the whole KB is encoded once, with the starting model (its score is epoch 0's), to pick
each mention's N best concepts under the strategy's last stage; later evaluations encode only the names of
those concepts and of the domain names' concepts (a re-ranking of fixed candidates: much cheaper, an
estimate that is exact for the ranking among those candidates and cannot see gold concepts the starting
model missed).
"""

from __future__ import annotations

import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from catalogue import RegistryError
from confection import Config, ConfigValidationError
from spacy.util import load_config, registry
from tqdm import tqdm

from ..errors import ConceptNormError, Errors
from ..io.files import recover_dir, write_dir_atomically, write_json
from ..kb.knowledge_base import DOMAIN, ONTOLOGY, Concept, KnowledgeBase
from ..linking.scoring import accuracy_at
from ..ml.name_encoder import NameEncoder
from ..ml.threads import training_threads
from ..search.sieve import SieveSearcher
from . import losses as _losses  # noqa: F401  (registers the losses)
from .data import build_training_data, gold_mentions, mention_pairs
from .encoder_settings import DevSettings, TrainingSettings, read_settings
from .samplers import Batch, TripletSampler

CHECKPOINT, STATE_FILE = "checkpoint", "trainer_state.pt"
REQUIRED_SECTIONS = ("encoder", "kb", "training", "training.loss", "training.sampler")


# --- config ---------------------------------------------------------------------------------------------------
def load_training_config(path: str | Path | Config, overrides: dict[str, Any] | None = None) -> Config:
    """The config with overrides applied and variables interpolated; ConceptNormError when it is unusable."""
    try:
        if isinstance(path, Config):
            config = Config().from_str(path.to_str(), overrides=overrides or {}, interpolate=True)
        else:
            if not Path(path).exists():
                raise ConceptNormError(Errors.E002.format(path=path))
            config = load_config(path, overrides=overrides or {}, interpolate=True)
    except (ConfigValidationError, ValueError, KeyError) as e:
        if isinstance(e, ConceptNormError):
            raise
        raise ConceptNormError(Errors.E701.format(detail=str(e).strip())) from None
    for section in REQUIRED_SECTIONS:
        node: Any = config
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ConceptNormError(Errors.E701.format(detail=f"missing section [{section}]"))
    return config


def _resolve(section: dict, what: str) -> Any:
    try:
        return registry.resolve({"x": section}, validate=True)["x"]
    except (ConfigValidationError, RegistryError, TypeError) as e:
        raise ConceptNormError(Errors.E701.format(detail=f"[{what}]: {str(e).strip()}")) from None


# --- model directories --------------------------------------------------------------------------------------------
def save_model(encoder: NameEncoder, path: Path, config: Config, metrics: dict, base_model: str) -> None:
    """A transformers model directory with the training config, the encoder settings and the metrics."""

    def write(tmp: Path) -> None:
        encoder.save(tmp)
        (tmp / "training.cfg").write_text(config.to_str())
        write_json(tmp / "encoder.json", {**encoder.config(), "model": base_model})
        write_json(tmp / "metrics.json", metrics)

    write_dir_atomically(path, write)


# --- dev evaluation -----------------------------------------------------------------------------------------------
def subset_kb(kb: KnowledgeBase, keep: set[str] | None = None) -> KnowledgeBase:
    """A copy of the KB's concepts (those in `keep`, or all) with their ontology names, and no domain names."""
    names_of: dict[str, list[str]] = defaultdict(list)
    for name in kb.names(ONTOLOGY):
        for cid in kb.concepts_for(name, 1):
            if keep is None or cid in keep:
                names_of[cid].append(kb.surface(name))
    out = KnowledgeBase(kb.normalizer)
    for cid, c in kb.concepts.items():
        if keep is None or cid in keep:
            out.add_concept(Concept(cid, c.canonical_name, c.alt_ids, c.parents, c.definition, c.types), names_of[cid])
    return out


class DevEvaluator:
    """Dev Acc@1/Acc@5 of the current encoder (see the module docstring for the protocol)."""

    def __init__(self, kb: KnowledgeBase, settings: DevSettings) -> None:
        self.kb, self.settings = kb, settings
        self.mentions = gold_mentions(settings.mentions)
        self.domain = mention_pairs(kb, settings.domain) if settings.domain else []
        self.candidates: list[str] | None = None

    @property
    def protocol(self) -> str:
        s = self.settings
        scope = f"top-{s.candidates} candidate concepts" if s.candidates else "whole KB"
        return f"{s.strategy} over the {scope}, domain names from {s.domain or 'none'}"

    def _searcher(self, encoder: NameEncoder, keep: set[str] | None, top_k: int) -> SieveSearcher:
        kb = subset_kb(self.kb, keep)
        kb.add_names(self.domain, DOMAIN)
        searcher = SieveSearcher(kb, encoder, self.settings.strategy, self.settings.threshold, top_k)
        searcher.build()
        return searcher

    def _score(self, searcher: SieveSearcher) -> dict[str, float]:
        """Acc@1 and Acc@5 under the strategy, and Acc@1 of each of its stages alone (`dev_acc1_OD-T`, ...)."""
        texts = [text for text, _ in self.mentions]

        def pairs(strategy: str | None) -> list:
            matches = searcher.search(texts, strategy)
            return [(gold, [[cid for cid, _ in m.candidates]]) for (_, gold), m in zip(self.mentions, matches)]

        scores = pairs(None)
        out = {"dev_acc1": accuracy_at(self.kb, scores, 1), "dev_acc5": accuracy_at(self.kb, scores, 5)}
        if len(searcher.stages) > 1:
            out.update({f"dev_acc1_{st}": accuracy_at(self.kb, pairs(str(st)), 1) for st in searcher.stages})
        return out

    def __call__(self, encoder: NameEncoder) -> dict[str, float]:
        s = self.settings
        if not s.candidates:
            return self._score(self._searcher(encoder, None, 5))
        full = {}
        if self.candidates is None:  # first call: the whole KB, and the candidates for every later call
            searcher = self._searcher(encoder, None, max(5, s.candidates))
            found = searcher.search([text for text, _ in self.mentions], str(searcher.stages[-1]))
            keep = {cid for m in found for cid, _ in m.candidates[: s.candidates]}
            self.candidates = sorted(keep | {cid for _, cid in self.domain})
            searcher.top_k = 5
            full = {f"{k}_full_kb": v for k, v in self._score(searcher).items()}
        return {**self._score(self._searcher(encoder, set(self.candidates), 5)), **full}


# --- training steps -----------------------------------------------------------------------------------------------
def token_lengths(encoder: NameEncoder, texts: list[str]) -> np.ndarray:
    lengths = np.zeros(len(texts), dtype=np.int32)
    for start in range(0, len(texts), 8192):
        ids = encoder.tokenizer(texts[start : start + 8192], truncation=True, max_length=encoder.max_length)
        lengths[start : start + 8192] = [len(x) for x in ids["input_ids"]]
    return lengths


def embed(encoder: NameEncoder, texts: list[str], micro_batch: int) -> torch.Tensor:
    """Pooled embeddings (with gradients) of texts already sorted by length, a micro-batch at a time, each
    padded to its own longest text."""
    dtype = encoder.autocast_dtype()
    parts = []
    with torch.autocast(encoder.device.split(":")[0], dtype=dtype, enabled=dtype is not None):
        for start in range(0, len(texts), micro_batch):
            parts.append(encoder.forward(encoder.tokenize(texts[start : start + micro_batch])))
    return torch.cat(parts).float()


def batch_loss(encoder, loss_fn, batch: Batch, texts: list[str], lengths: np.ndarray, micro_batch: int):
    order = sorted(range(len(batch)), key=lambda i: lengths[batch.texts[i]])
    batch = batch.reordered(order)
    embeddings = embed(encoder, [texts[t] for t in batch.texts], micro_batch)
    return loss_fn(embeddings, batch.same_concept(embeddings.device))


# --- checkpoints --------------------------------------------------------------------------------------------------
def _rng_state() -> dict:
    """The random states, in types that `torch.load(weights_only=True)` reads (numpy's key array as a list)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = (name, keys.tolist(), int(pos), int(has_gauss), float(cached))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, encoder: NameEncoder, optimizer, scheduler, state: dict) -> None:
    def write(tmp: Path) -> None:
        encoder.save(tmp)
        optim = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save({**state, **optim, "rng": _rng_state(), "threads": torch.get_num_threads()}, tmp / STATE_FILE)

    write_dir_atomically(path, write)


def load_checkpoint_state(path: Path) -> dict:
    recover_dir(path)  # killed while the next checkpoint was moved in: the one before
    if not (path / STATE_FILE).exists():
        raise ConceptNormError(Errors.E705.format(path=path.parent))
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types on a truncated file
        raise ConceptNormError(Errors.E710.format(path=path, detail=f"{type(e).__name__}: {e}")) from None


# --- the runner ---------------------------------------------------------------------------------------------------
def _log(message: str) -> None:
    tqdm.write(message)


def train(
    config: str | Path | Config,
    output_dir: str | Path,
    overrides: dict[str, Any] | None = None,
    resume: bool = False,
) -> dict:
    """Train the name encoder as the config says; return the final metrics (also in OUTPUT/metrics.json).

    config (Path or Config): A training config (configs/train_*.cfg).
    output_dir (Path): Receives model-best/, model-last/, checkpoint/, training.cfg and metrics.json.
    overrides (dict): Dotted keys to override, e.g. {"training.batch_size": 128}.
    resume (bool): Continue from OUTPUT/checkpoint (the epoch after the one it saved).
    """
    started = time.perf_counter()
    config = load_training_config(config, overrides)
    output = Path(output_dir)
    raw = config["training"]
    plain = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    settings = read_settings(TrainingSettings, plain, "training")
    saved = load_checkpoint_state(output / CHECKPOINT) if resume else None
    # a resumed run keeps the thread count it started with: gradients differ in their last bits across counts
    first = (saved or {}).get("threads")
    with training_threads(settings.threads or (first if isinstance(first, int) else 0)):
        return _train(config, output, settings, saved, started)


def _train(config: Config, output: Path, settings: TrainingSettings, saved: dict | None, started: float) -> dict:
    raw = config["training"]
    dev_settings = read_settings(DevSettings, dict(raw.get("dev") or {}), "training.dev")
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)

    checkpoint = output / CHECKPOINT
    encoder: NameEncoder = _resolve(config["encoder"], "encoder")
    base_model = encoder.reference
    if saved is not None:
        encoder.reference = str(checkpoint)  # loaded lazily: the checkpoint's weights, the config's settings
    kb: KnowledgeBase = _resolve(config["kb"], "kb")
    loss_fn = _resolve(raw["loss"], "training.loss")
    sampler: TripletSampler = _resolve(raw["sampler"], "training.sampler")
    if not callable(loss_fn):
        raise ConceptNormError(
            Errors.E711.format(
                what="[training.loss]", expected="a loss(embeddings, same) callable", found=type(loss_fn).__name__
            )
        )
    if not isinstance(sampler, TripletSampler):
        raise ConceptNormError(
            Errors.E711.format(what="[training.sampler]", expected="a TripletSampler", found=type(sampler).__name__)
        )

    data = build_training_data(kb, settings.train_on, settings.domain, settings.domain_ratio, settings.seed)
    sampler.setup(data)
    if settings.batch_size < sampler.group_size():
        raise ConceptNormError(
            Errors.E709.format(batch_size=settings.batch_size, strategy=sampler.strategy, needed=sampler.group_size())
        )
    evaluator = DevEvaluator(kb, dev_settings) if dev_settings.mentions else None
    _log(f"Training data: {data.summary()}; sampler {sampler.strategy}; device {encoder.device}, "
         f"{torch.get_num_threads()} threads, autocast {encoder.autocast_dtype()}")  # fmt: skip

    model = encoder.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    per_epoch = sampler.estimate_batches(settings.batch_size)
    total_steps = min(settings.max_steps or 10**12, settings.max_epochs * per_epoch)
    from transformers import get_scheduler

    scheduler = get_scheduler(settings.scheduler, optimizer, settings.warmup_steps, total_steps)
    lengths = token_lengths(encoder, data.texts)
    state = {"epoch": 0, "step": 0, "history": [], "best": None, "best_epoch": None, "bad_epochs": 0,
             "elapsed": 0.0, "candidates": None}  # fmt: skip
    if saved is not None:
        try:
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            _set_rng_state(saved["rng"])
            state.update({k: saved[k] for k in state})
        except (KeyError, ValueError) as e:
            raise ConceptNormError(Errors.E710.format(path=checkpoint, detail=f"{type(e).__name__}: {e}")) from None
        if evaluator is not None:
            evaluator.candidates = state["candidates"]
        _log(f"Resuming after epoch {state['epoch']} (step {state['step']}).")
    elif evaluator is not None:
        t = time.perf_counter()
        scores = evaluator(encoder)
        state["candidates"] = evaluator.candidates
        state["history"].append({"epoch": 0, "step": 0, **scores, "eval_seconds": round(time.perf_counter() - t, 1)})
        # the starting model is the one to beat: an epoch that scores lower on dev never becomes model-best
        state["best"], state["best_epoch"] = scores["dev_acc1"], 0
        whole = f"; whole KB {100 * scores['dev_acc1_full_kb']:.2f}" if "dev_acc1_full_kb" in scores else ""
        _log(f"Epoch 0 (starting model): dev Acc@1 {100 * scores['dev_acc1']:.2f}{whole} ({evaluator.protocol})")
    output.mkdir(parents=True, exist_ok=True)
    (output / "training.cfg").write_text(config.to_str())
    if saved is None and state["best_epoch"] == 0:
        save_model(encoder, output / "model-best", config, _metrics(state, evaluator, settings, None), base_model)

    dtype = encoder.autocast_dtype()
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16 and encoder.device.startswith("cuda"))
    time_limit = settings.max_minutes * 60 if settings.max_minutes else float("inf")
    run_start = started - state["elapsed"]  # max_minutes counts set-up and evaluations too
    stop_reason = "max_steps reached" if settings.max_steps and state["step"] >= settings.max_steps else None
    while stop_reason is None and state["epoch"] < settings.max_epochs:
        epoch = state["epoch"] + 1
        t_epoch = time.perf_counter()
        losses = []
        bar = tqdm(
            sampler.batches(epoch, settings.seed, settings.batch_size, encoder), total=per_epoch,
            desc=f"epoch {epoch}", unit="batch", mininterval=1 if sys.stderr.isatty() else 30,
        )  # fmt: skip
        model.train()
        for batch in bar:
            loss = batch_loss(encoder, loss_fn, batch, data.texts, lengths, settings.micro_batch)
            if loss.requires_grad:
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if settings.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
            state["step"] += 1
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", step=state["step"], refresh=False)
            if settings.max_steps and state["step"] >= settings.max_steps:
                stop_reason = f"max_steps {settings.max_steps} reached"
            elif time.perf_counter() - run_start > time_limit:
                stop_reason = f"max_minutes {settings.max_minutes} reached"
            if stop_reason:
                break
        bar.close()
        train_seconds = time.perf_counter() - t_epoch
        record = {"epoch": epoch, "step": state["step"], "loss": float(np.mean(losses)) if losses else None,
                  "batches": len(losses), "train_seconds": round(train_seconds, 1)}  # fmt: skip
        if evaluator is not None:
            t = time.perf_counter()
            record.update(evaluator(encoder))
            record["eval_seconds"] = round(time.perf_counter() - t, 1)
        score = record.get("dev_acc1")
        improved = evaluator is None or state["best"] is None or score > state["best"] + 1e-9
        if improved:
            state["best"], state["best_epoch"], state["bad_epochs"] = score, epoch, 0
        else:
            state["bad_epochs"] += 1
        state["epoch"] = epoch
        state["history"].append(record)
        state["elapsed"] = time.perf_counter() - run_start
        metrics = _metrics(state, evaluator, settings, stop_reason)
        save_model(encoder, output / "model-last", config, {**metrics, "this_epoch": record}, base_model)
        if improved:
            save_model(encoder, output / "model-best", config, {**metrics, "this_epoch": record}, base_model)
        save_checkpoint(checkpoint, encoder, optimizer, scheduler, state)
        write_json(output / "metrics.json", metrics)
        dev = f", dev Acc@1 {100 * score:.2f}{' (best)' if improved else ''}" if evaluator is not None else ""
        _log(f"Epoch {epoch}: {len(losses)} batches, loss {record['loss'] or 0:.4f}, {train_seconds / 60:.1f} min{dev}")
        if settings.patience and state["bad_epochs"] >= settings.patience:
            stop_reason = f"no dev improvement in {settings.patience} epochs"
    metrics = _metrics(state, evaluator, settings, stop_reason or "max_epochs reached")
    metrics["wall_seconds_this_run"] = round(time.perf_counter() - started, 1)
    write_json(output / "metrics.json", metrics)
    _log(f"Done ({metrics['stopped']}): best epoch {state['best_epoch']}, {output / 'model-best'}")
    return metrics


def _metrics(state: dict, evaluator: DevEvaluator | None, settings: TrainingSettings, stopped: str | None) -> dict:
    return {
        "best_epoch": state["best_epoch"],
        "best_dev_acc1": state["best"],
        "epochs": state["epoch"],
        "steps": state["step"],
        "elapsed_seconds": round(state["elapsed"], 1),
        "stopped": stopped,
        "dev_protocol": evaluator.protocol if evaluator is not None else None,
        "settings": settings.model_dump(),
        "history": state["history"],
    }
