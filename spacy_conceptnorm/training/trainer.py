"""The training runner: `train(config, output_dir, overrides, resume)`, also `spacy-conceptnorm train`.

Reads a spaCy-style config (`configs/train_xu_bethard.cfg` is the default recipe), builds the training texts
(Train:O or Train:OD), and trains the name encoder on batches from the configured sampler with the configured
loss. Each epoch it measures dev Acc@1, writes `OUTPUT/model-last`, `OUTPUT/model-best` when dev beat every
earlier epoch (the starting model, epoch 0, included), and a checkpoint `OUTPUT/checkpoint` that `resume=True`
continues from (model, optimizer, schedule, random states, history). Every directory is written beside its
target and renamed into place, so an interrupted run leaves the previous complete version. A model directory
is a transformers model that `NameEncoder(path)` loads, with `training.cfg`, `encoder.json` and `metrics.json`
beside the weights.

Budget: `max_epochs` and `max_steps`, the same steps on every machine (`patience` may end a run sooner, by its dev
scores); the learning-rate schedule runs over `schedule_steps`, or over the budget when that is 0. `max_minutes` is
only a safety stop: when it fires, the run ends with a `SafetyStopWarning` (see `budget`).

The run is a few steps over a `TrainingState` (what a checkpoint saves) and a `TrainingRun` (what it trains with):
`_set_up`, then `_restore` (a checkpoint) or `_evaluate_start` (the starting model as epoch 0), then `_run_epoch`
until a stop (`_train_epoch`, `_evaluate_epoch`, `_save_epoch`), then `_finish`.

Speed on CPU: each batch is sorted by token length and encoded in micro-batches padded only to their own
longest name; bf16 autocast where `NameEncoder.autocast_dtype()` allows; `threads` sets torch's threads (0:
torch's, or one when spinning threads meet a busy machine, see `ml.threads.training_threads`; a resumed run keeps
its count).

Dev protocol (`[training.dev]`): the dev mentions are searched with `strategy` (default D-T+OD-T, domain
names from `domain`) as in docs/benchmarks.md. With `candidates = 0` every evaluation encodes the whole KB.
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
from collections.abc import Callable
from dataclasses import dataclass, field, fields
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
from .budget import warn_safety_stop
from .data import TrainingData, build_training_data, gold_mentions, mention_pairs
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


# --- the state of a run -------------------------------------------------------------------------------------------
@dataclass
class TrainingState:
    """Where a run stands after its last epoch: what a checkpoint saves beside the weights, the optimizer and the
    random states, and what `resume` continues from.

    epoch (int): The last finished epoch (0: none yet; the starting model is epoch 0).
    step (int): Optimizer steps taken, over all epochs and resumed runs.
    history (List[dict]): One record per evaluated epoch (steps, loss, batches, seconds, dev scores), epoch 0 first.
    best (Optional[float]): The best dev Acc@1 so far (None before any evaluation, or without dev mentions).
    best_epoch (Optional[int]): The epoch that is `OUTPUT/model-best`.
    bad_epochs (int): Epochs in a row without a better dev Acc@1, for `patience`.
    elapsed (float): Seconds since the run began, set-up and evaluations included, over resumed runs too.
    candidates (Optional[List[str]]): The dev evaluator's fixed candidate concepts (`DevEvaluator.candidates`).
    """

    epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    best_epoch: int | None = None
    bad_epochs: int = 0
    elapsed: float = 0.0
    candidates: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The state as a checkpoint holds it: one key per field, the format every version has written."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainingState:
        """The state a checkpoint saved (its other keys, the optimizer's and the random states, are left alone).

        saved (dict): What `load_checkpoint_state` read. Raises KeyError when a field is missing.
        """
        return cls(**{f.name: saved[f.name] for f in fields(cls)})


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


def save_checkpoint(path: Path, encoder: NameEncoder, optimizer, scheduler, state: TrainingState) -> None:
    """The weights and `STATE_FILE`: the state's fields, the optimizer's and the schedule's states, the random states
    and the thread count, in one flat dict (the format `load_checkpoint_state` reads, whatever the version)."""

    def write(tmp: Path) -> None:
        encoder.save(tmp)
        optim = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        saved = {**state.to_dict(), **optim, "rng": _rng_state(), "threads": torch.get_num_threads()}
        torch.save(saved, tmp / STATE_FILE)

    write_dir_atomically(path, write)


def load_checkpoint_state(path: Path) -> dict:
    """The dict `save_checkpoint` wrote in `path`; ConceptNormError when there is none or it cannot be read."""
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


def schedule_length(settings: TrainingSettings, per_epoch: int) -> int:
    """The steps over which the learning-rate schedule runs: `schedule_steps` where given, else the run's own budget.

    settings (TrainingSettings): The run's settings. per_epoch (int): About how many batches an epoch gives.
    """
    return settings.schedule_steps or planned_steps(settings, per_epoch)


def planned_steps(settings: TrainingSettings, per_epoch: int) -> int:
    """The steps the budget allows: the lesser of `max_steps` (0: no limit) and `max_epochs` epochs of about
    `per_epoch` batches. The same on every machine; only patience or the safety stop end a run sooner."""
    return min(settings.max_steps or 10**12, settings.max_epochs * per_epoch)


@dataclass
class TrainingRun:
    """What a run trains with, built once by `_set_up`; the functions below take it with the `TrainingState`.

    config (Config): The interpolated training config. output (Path): The output directory.
    settings (TrainingSettings): The plain keys of [training]. encoder (NameEncoder): The encoder being trained.
    base_model (str): The model the run started from (recorded in encoder.json).
    loss_fn (Callable): loss(embeddings, same_concept). sampler (TripletSampler): Set up on `data`.
    data (TrainingData): The training texts. evaluator (Optional[DevEvaluator]): None without dev mentions.
    optimizer (Optimizer): AdamW over the model. scheduler (LRScheduler): The transformers schedule.
    scaler (GradScaler): fp16 loss scaling, enabled only for fp16 autocast on CUDA.
    lengths (np.ndarray): Each training text's token count, to sort a batch by length.
    per_epoch (int): About how many batches an epoch gives. started (float): `time.perf_counter()` at `train()`.
    clock_start (float): Where the safety stop's minutes count from: `started` less the time of earlier runs.
    """

    config: Config
    output: Path
    settings: TrainingSettings
    encoder: NameEncoder
    base_model: str
    loss_fn: Callable
    sampler: TripletSampler
    data: TrainingData
    evaluator: DevEvaluator | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    lengths: np.ndarray
    per_epoch: int
    started: float
    clock_start: float = 0.0

    @property
    def checkpoint(self) -> Path:
        return self.output / CHECKPOINT

    @property
    def planned_steps(self) -> int:
        return planned_steps(self.settings, self.per_epoch)


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
    """Set up, restore or evaluate the starting model, train epoch after epoch until a stop, and finish."""
    run = _set_up(config, output, settings, saved is not None, started)
    state = _restore(run, saved) if saved is not None else _evaluate_start(run)
    _write_start(run, state, resumed=saved is not None)
    run.clock_start = started - state.elapsed  # the safety stop counts set-up and evaluations too
    stop = "max_steps reached" if settings.max_steps and state.step >= settings.max_steps else None
    while stop is None and state.epoch < settings.max_epochs:
        stop = _run_epoch(run, state)
    return _finish(run, state, stop or "max_epochs reached")


# --- set-up -------------------------------------------------------------------------------------------------------
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _loss_and_sampler(raw: dict) -> tuple[Callable, TripletSampler]:
    """The configured loss and sampler, checked to be what the runner calls them as."""
    loss_fn = _resolve(raw["loss"], "training.loss")
    sampler = _resolve(raw["sampler"], "training.sampler")
    if not callable(loss_fn):
        found = type(loss_fn).__name__
        raise ConceptNormError(
            Errors.E711.format(what="[training.loss]", expected="a loss(embeddings, same) callable", found=found)
        )
    if not isinstance(sampler, TripletSampler):
        raise ConceptNormError(
            Errors.E711.format(what="[training.sampler]", expected="a TripletSampler", found=type(sampler).__name__)
        )
    return loss_fn, sampler


def _set_up(config: Config, output: Path, settings: TrainingSettings, resumed: bool, started: float) -> TrainingRun:
    """Seed, build the encoder, the KB, the loss, the sampler, the training texts, the dev evaluator, the optimizer
    and its schedule, in this order (the random draws of a run depend on it)."""
    raw = config["training"]
    dev_settings = read_settings(DevSettings, dict(raw.get("dev") or {}), "training.dev")
    _seed_everything(settings.seed)
    encoder: NameEncoder = _resolve(config["encoder"], "encoder")
    base_model = encoder.reference
    if resumed:
        encoder.reference = str(output / CHECKPOINT)  # loaded lazily: the checkpoint's weights, the config's settings
    kb: KnowledgeBase = _resolve(config["kb"], "kb")
    loss_fn, sampler = _loss_and_sampler(raw)
    data = build_training_data(kb, settings.train_on, settings.domain, settings.domain_ratio, settings.seed)
    sampler.setup(data)
    if settings.batch_size < sampler.group_size():
        raise ConceptNormError(
            Errors.E709.format(batch_size=settings.batch_size, strategy=sampler.strategy, needed=sampler.group_size())
        )
    evaluator = DevEvaluator(kb, dev_settings) if dev_settings.mentions else None
    _log(f"Training data: {data.summary()}; sampler {sampler.strategy}; device {encoder.device}, "
         f"{torch.get_num_threads()} threads, autocast {encoder.autocast_dtype()}")  # fmt: skip

    per_epoch = sampler.estimate_batches(settings.batch_size)
    optimizer, scheduler = _optimizer_and_schedule(encoder, settings, per_epoch)
    lengths = token_lengths(encoder, data.texts)
    dtype = encoder.autocast_dtype()
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16 and encoder.device.startswith("cuda"))
    run = TrainingRun(config, output, settings, encoder, base_model, loss_fn, sampler, data, evaluator, optimizer,
                      scheduler, scaler, lengths, per_epoch, started)  # fmt: skip
    _log_budget(run)
    return run


def _optimizer_and_schedule(encoder: NameEncoder, settings: TrainingSettings, per_epoch: int) -> tuple[Any, Any]:
    """AdamW over the encoder's model (loaded here, and put in training mode), and its transformers schedule over
    `schedule_length` steps."""
    from transformers import get_scheduler

    model = encoder.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    total_steps = schedule_length(settings, per_epoch)
    return optimizer, get_scheduler(settings.scheduler, optimizer, settings.warmup_steps, total_steps)


def _log_budget(run: TrainingRun) -> None:
    """One line with the steps the run will take, its schedule's length and its safety stop."""
    s = run.settings
    safety = f"safety stop after {s.max_minutes:g} min" if s.max_minutes else "no safety stop"
    epochs = f"{s.max_epochs} epoch{'s' if s.max_epochs > 1 else ''} of about {run.per_epoch} batches"
    _log(f"Budget: {epochs}, max_steps {s.max_steps or 'none'}: about {run.planned_steps} steps; learning-rate "
         f"schedule over {schedule_length(s, run.per_epoch)} steps; {safety}")  # fmt: skip


# --- the starting point: a checkpoint, or the starting model's dev scores ---------------------------------------------
def _restore(run: TrainingRun, saved: dict) -> TrainingState:
    """The state of the checkpoint `saved`, with the optimizer's, the schedule's and the random states it saved."""
    try:
        run.optimizer.load_state_dict(saved["optimizer"])
        run.scheduler.load_state_dict(saved["scheduler"])
        _set_rng_state(saved["rng"])
        state = TrainingState.from_dict(saved)
    except (KeyError, ValueError) as e:
        raise ConceptNormError(Errors.E710.format(path=run.checkpoint, detail=f"{type(e).__name__}: {e}")) from None
    if run.evaluator is not None:
        run.evaluator.candidates = state.candidates
    _log(f"Resuming after epoch {state.epoch} (step {state.step}).")
    return state


def _evaluate_start(run: TrainingRun) -> TrainingState:
    """A new run's state: with dev mentions, the starting model's scores as epoch 0, the one to beat (an epoch that
    scores lower on dev never becomes model-best)."""
    state = TrainingState()
    if run.evaluator is None:
        return state
    t = time.perf_counter()
    scores = run.evaluator(run.encoder)
    state.candidates = run.evaluator.candidates
    state.history.append({"epoch": 0, "step": 0, **scores, "eval_seconds": round(time.perf_counter() - t, 1)})
    state.best, state.best_epoch = scores["dev_acc1"], 0
    whole = f"; whole KB {100 * scores['dev_acc1_full_kb']:.2f}" if "dev_acc1_full_kb" in scores else ""
    _log(f"Epoch 0 (starting model): dev Acc@1 {100 * scores['dev_acc1']:.2f}{whole} ({run.evaluator.protocol})")
    return state


def _write_start(run: TrainingRun, state: TrainingState, resumed: bool) -> None:
    """OUTPUT/training.cfg, and for a new run whose starting model was evaluated, that model as model-best."""
    run.output.mkdir(parents=True, exist_ok=True)
    (run.output / "training.cfg").write_text(run.config.to_str())
    if not resumed and state.best_epoch == 0:
        metrics = _metrics(state, run.evaluator, run.settings, None)
        save_model(run.encoder, run.output / "model-best", run.config, metrics, run.base_model)


# --- one epoch ----------------------------------------------------------------------------------------------------
def _run_epoch(run: TrainingRun, state: TrainingState) -> str | None:
    """Train, evaluate and save the next epoch; why the run stops after it, or None to go on."""
    epoch = state.epoch + 1
    t_epoch = time.perf_counter()
    losses, stop = _train_epoch(run, state, epoch)
    train_seconds = time.perf_counter() - t_epoch
    record = {"epoch": epoch, "step": state.step, "loss": float(np.mean(losses)) if losses else None,
              "batches": len(losses), "train_seconds": round(train_seconds, 1)}  # fmt: skip
    improved = _evaluate_epoch(run, state, record)
    state.epoch = epoch
    state.history.append(record)
    state.elapsed = time.perf_counter() - run.clock_start
    _save_epoch(run, state, record, improved, stop)
    score = record.get("dev_acc1")
    dev = f", dev Acc@1 {100 * score:.2f}{' (best)' if improved else ''}" if run.evaluator is not None else ""
    _log(f"Epoch {epoch}: {len(losses)} batches, loss {record['loss'] or 0:.4f}, {train_seconds / 60:.1f} min{dev}")
    patience = run.settings.patience
    if patience and state.bad_epochs >= patience:
        stop = f"no dev improvement in {patience} epochs"
    return stop


def _train_epoch(run: TrainingRun, state: TrainingState, epoch: int) -> tuple[list[float], str | None]:
    """One pass over the sampler's batches of `epoch`, an optimizer step each; its losses, and why it stopped early
    (max_steps, or the safety stop) or None."""
    s = run.settings
    losses: list[float] = []
    stop = None
    bar = tqdm(
        run.sampler.batches(epoch, s.seed, s.batch_size, run.encoder), total=run.per_epoch,
        desc=f"epoch {epoch}", unit="batch", mininterval=1 if sys.stderr.isatty() else 30,
    )  # fmt: skip
    run.encoder.model.train()
    for batch in bar:
        loss = batch_loss(run.encoder, run.loss_fn, batch, run.data.texts, run.lengths, s.micro_batch)
        if loss.requires_grad:
            _optimizer_step(run, loss)
        state.step += 1
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", step=state.step, refresh=False)
        stop = _stop_after_step(run, state)
        if stop:
            break
    bar.close()
    return losses, stop


def _optimizer_step(run: TrainingRun, loss: torch.Tensor) -> None:
    """Backpropagate `loss` (scaled for fp16), clip the gradients' norm, step the optimizer and the schedule."""
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    if run.settings.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.encoder.model.parameters(), run.settings.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()


def _stop_after_step(run: TrainingRun, state: TrainingState) -> str | None:
    """Why the run stops after this step: its `max_steps`, or (with a SafetyStopWarning) its `max_minutes`."""
    s = run.settings
    if s.max_steps and state.step >= s.max_steps:
        return f"max_steps {s.max_steps} reached"
    if s.max_minutes and time.perf_counter() - run.clock_start > s.max_minutes * 60:
        warn_safety_stop("Training", "[training] max_minutes", s.max_minutes, state.step, run.planned_steps)
        return f"max_minutes {s.max_minutes:g} reached (safety stop)"
    return None


def _evaluate_epoch(run: TrainingRun, state: TrainingState, record: dict[str, Any]) -> bool:
    """The epoch's dev scores into `record`; whether they beat every earlier epoch's (then it is the best, and
    `bad_epochs` starts again). Without dev mentions every epoch is the best."""
    if run.evaluator is not None:
        t = time.perf_counter()
        record.update(run.evaluator(run.encoder))
        record["eval_seconds"] = round(time.perf_counter() - t, 1)
    score = record.get("dev_acc1")
    improved = run.evaluator is None or state.best is None or score > state.best + 1e-9
    if improved:
        state.best, state.best_epoch, state.bad_epochs = score, record["epoch"], 0
    else:
        state.bad_epochs += 1
    return improved


def _save_epoch(run: TrainingRun, state: TrainingState, record: dict, improved: bool, stop: str | None) -> None:
    """model-last, model-best when the epoch improved, the checkpoint, and metrics.json (each replaced whole)."""
    metrics = _metrics(state, run.evaluator, run.settings, stop)
    epoch_metrics = {**metrics, "this_epoch": record}
    save_model(run.encoder, run.output / "model-last", run.config, epoch_metrics, run.base_model)
    if improved:
        save_model(run.encoder, run.output / "model-best", run.config, epoch_metrics, run.base_model)
    save_checkpoint(run.checkpoint, run.encoder, run.optimizer, run.scheduler, state)
    write_json(run.output / "metrics.json", metrics)


# --- finishing ----------------------------------------------------------------------------------------------------
def _finish(run: TrainingRun, state: TrainingState, stopped: str) -> dict:
    """The final metrics, with this run's wall time, written to OUTPUT/metrics.json and returned."""
    metrics = _metrics(state, run.evaluator, run.settings, stopped)
    metrics["wall_seconds_this_run"] = round(time.perf_counter() - run.started, 1)
    write_json(run.output / "metrics.json", metrics)
    _log(f"Done ({stopped}): best epoch {state.best_epoch}, {run.output / 'model-best'}")
    return metrics


def _metrics(
    state: TrainingState, evaluator: DevEvaluator | None, settings: TrainingSettings, stopped: str | None
) -> dict:
    """metrics.json: the best epoch, steps, time, why the run stopped, the settings and every epoch's record."""
    return {
        "best_epoch": state.best_epoch,
        "best_dev_acc1": state.best,
        "epochs": state.epoch,
        "steps": state.step,
        "elapsed_seconds": round(state.elapsed, 1),
        "stopped": stopped,
        "dev_protocol": evaluator.protocol if evaluator is not None else None,
        "settings": settings.model_dump(),
        "history": state.history,
    }
