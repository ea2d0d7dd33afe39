"""Training BNE on a knowledge base's synonym sets (Phan et al. 2019, sections 3.2 and 4).

Adam (lr 0.001), gradient clipping at 5.0, batches of 64 anchor names, dropout 0.5, the three objectives of
`objectives`, and the epoch with the best validation accuracy kept (the paper stops on validation name
normalization accuracy; here the nearest-name Acc@1 of the `dev` mentions, when given). The concepts of a
seeded held-out split are left out of training, for `evaluate.synonym_closeness`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ConceptNormError, Errors
from ..evaluation.bne_metrics import gold_mentions, nearest_name_accuracy
from ..kb.knowledge_base import KnowledgeBase, load_kb
from ..kb.synonyms import held_out_concepts, synonym_sets
from ..ml.bne.encoder import BNEEncoder
from ..ml.bne.model import BNE, BNEConfig
from ..ml.bne.vocab import Vocab
from .bne_data import SynonymData
from .bne_objectives import OBJECTIVES, bne_losses, draw_negatives
from .word_vectors import WordVectors, text_sentences, train_word_vectors


@dataclass
class TrainConfig:
    """Training settings (the paper's in brackets).

    epochs (int): Passes over the (name, concept) pairs (the paper: until validation accuracy stops rising).
    pairs_per_epoch (int): Anchors per epoch, 0 for all of them.
    batch_size (int): Anchors per batch (64).
    lr (float): Adam's learning rate (0.001).
    clip (float): Gradient norm clipping (5.0).
    holdout (int): Concepts left out of training for the closeness evaluation (1000).
    seed (int): Seeds the split, the batches and the initialization.
    objectives (List[str]): Any of "syn", "def", "ctx" (all three).
    char_dim, char_hidden, word_hidden, out_dim, dropout: The network's sizes, see `BNEConfig`.
    """

    epochs: int = 3
    pairs_per_epoch: int = 0
    batch_size: int = 64
    lr: float = 1e-3
    clip: float = 5.0
    holdout: int = 1000
    seed: int = 0
    objectives: list[str] = field(default_factory=lambda: list(OBJECTIVES))
    char_dim: int = 50
    char_hidden: int = 100
    word_hidden: int = 100
    out_dim: int = 200
    dropout: float = 0.5

    def check(self) -> None:
        """Raise ConceptNormError for a setting training cannot use."""
        for key in ("epochs", "batch_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConceptNormError(Errors.E964.format(name=key, expected="a positive integer", value=value))
        if not self.objectives or set(self.objectives) - set(OBJECTIVES):
            expected = f"a non-empty list of {OBJECTIVES}"
            raise ConceptNormError(Errors.E964.format(name="objectives", expected=expected, value=self.objectives))


def build_encoder(vectors: WordVectors, names: Sequence[str], config: TrainConfig) -> BNEEncoder:
    """An untrained encoder: the word vectors (a zero row in front), the characters of `names`."""
    vocab = Vocab.build(vectors.words, names)
    matrix = torch.cat([torch.zeros(1, vectors.dim), torch.from_numpy(vectors.vectors).float()])
    network = BNEConfig(
        vocab.n_chars, config.char_dim, config.char_hidden, config.word_hidden, config.out_dim, config.dropout
    )
    if vectors.dim != config.out_dim and set(config.objectives) & {"def", "ctx"}:
        detail = f"out_dim = {vectors.dim} (the word vectors' size: the def and ctx objectives compare with them)"
        raise ConceptNormError(Errors.E964.format(name="out_dim", expected=detail, value=config.out_dim))
    return BNEEncoder(BNE(network, matrix), vocab, reference="bne (training)")


def contextual_vectors(encoder: BNEEncoder, names: Sequence[str], batch_size: int = 4096) -> torch.Tensor:
    """q(s) for every name: the mean pre-trained vector of its words (constants: the word vectors are frozen)."""
    with torch.no_grad():
        return torch.cat([
            encoder.model.average_word_vectors(encoder.vocab.batch(names[s : s + batch_size]))
            for s in range(0, len(names), batch_size)
        ])  # fmt: skip


def concept_vectors(q: torch.Tensor, members: Sequence[np.ndarray]) -> torch.Tensor:
    """g(c) for every concept: the mean of q over its names."""
    return torch.stack([q[torch.from_numpy(m)].mean(dim=0) for m in members])


def train_bne(
    kb: KnowledgeBase,
    vectors: WordVectors,
    config: TrainConfig | None = None,
    dev: Sequence[tuple[str, str]] = (),
    log: Callable[[str], None] = print,
) -> tuple[BNEEncoder, dict]:
    """Train a BNE encoder on the synonym sets of `kb`.

    kb (KnowledgeBase): Its ontology names grouped by concept are the training data.
    vectors (WordVectors): Pre-trained word vectors (frozen).
    config (TrainConfig): Settings.
    dev (Sequence[Tuple[str, str]]): (mention, concept id) pairs; the epoch with the best nearest-name Acc@1 on
        them is kept (all KB names searched). Empty: the last epoch is kept.
    log (Callable[[str], None]): Progress lines.
    RETURNS (Tuple[BNEEncoder, dict]): The encoder (eval mode) and a report: held-out concepts, losses and dev
        accuracy per epoch, seconds.
    """
    config = config or TrainConfig()
    config.check()
    torch.manual_seed(config.seed)
    held_out = held_out_concepts(kb, config.holdout, config.seed)
    data = SynonymData(synonym_sets(kb, exclude=set(held_out)), seed=config.seed)
    encoder = build_encoder(vectors, data.names, config)
    model = encoder.model
    q = contextual_vectors(encoder, data.names)
    g = concept_vectors(q, data.members)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    objectives = tuple(config.objectives)
    rng = np.random.default_rng(config.seed)
    kb_names = kb.names()
    report = {"config": asdict(config), "held_out": held_out, "training_pairs": len(data), "epochs": []}
    log(f"{len(data.concepts)} concepts, {len(data)} (name, concept) pairs ({len(held_out)} concepts held out)")
    best, best_state, start = -1.0, None, time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        model.train()
        totals = dict.fromkeys(objectives, 0.0)
        steps = 0
        for batch in data.batches(config.batch_size, config.pairs_per_epoch or None):
            n = len(batch.anchors)
            f = model(encoder.vocab.batch(batch.anchors + batch.positives))
            negatives = {name: draw_negatives(batch.concepts, rng) for name in objectives}
            losses = bne_losses(
                f[:n], f[n:], torch.from_numpy(batch.has_synonym), q[torch.from_numpy(batch.names)],
                g[torch.from_numpy(batch.concepts)], negatives, objectives,
            )  # fmt: skip
            optimizer.zero_grad()
            sum(losses.values()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            optimizer.step()
            for name, value in losses.items():
                totals[name] += value.item()
            steps += 1
        row = {"epoch": epoch, "seconds": round(time.perf_counter() - start, 1)}
        row.update({f"loss_{k}": round(v / max(steps, 1), 4) for k, v in totals.items()})
        if dev:
            texts, gold = zip(*dev)
            row["dev_acc1"] = round(
                nearest_name_accuracy(encoder.encode(list(texts)), gold, encoder.encode(kb_names), kb_names, kb), 4
            )
            if row["dev_acc1"] > best:
                best, best_state = row["dev_acc1"], {k: v.clone() for k, v in model.state_dict().items()}
        report["epochs"].append(row)
        log("  ".join(f"{k} {v}" for k, v in row.items()))
    if best_state is not None:
        model.load_state_dict(best_state)
        report["best_epoch"] = max(report["epochs"], key=lambda r: r["dev_acc1"])["epoch"]
    report["train_seconds"] = round(time.perf_counter() - start, 1)
    model.eval()
    encoder.reference = "bne"
    return encoder, report


def train_from_files(
    kb_path: str | Path,
    output: str | Path,
    config: TrainConfig,
    vectors_path: str | Path | None = None,
    text: Sequence[str | Path] = (),
    ctd_tsv: str | Path | None = None,
    dev_path: str | Path | None = None,
    save_vectors: str | Path | None = None,
    log: Callable[[str], None] = print,
    word2vec: dict | None = None,
) -> dict:
    """The `train-bne` command: load the KB, read or train word vectors, train, save the encoder to `output`.

    kb_path (Path): Ontology file or saved `.kb`.
    output (Path): The encoder directory to write (replaced whole, atomically).
    config (TrainConfig): Training settings.
    vectors_path (Path): word2vec text-format vectors; None trains skip-gram vectors on `text`, the KB's names
        and `ctd_tsv`'s definitions (needs gensim).
    text (Sequence[Path]): PubTator files for the word vectors.
    ctd_tsv (Path): A CTD diseases TSV whose definitions join the word-vector text.
    dev_path (Path): A PubTator file whose mentions choose the best epoch.
    save_vectors (Path): Also write trained word vectors here.
    word2vec (dict): Skip-gram settings for `train_word_vectors` (window, negative, min_count, epochs, workers);
        the vectors' size is `config.out_dim` and their seed `config.seed`.
    RETURNS (dict): The training report (also written to OUTPUT/training.json).
    """
    kb = load_kb(kb_path)
    start = time.perf_counter()
    if vectors_path is not None:
        vectors = WordVectors.from_disk(vectors_path)
        source = str(vectors_path)
    else:
        sentences = list(text_sentences(text, kb_path, ctd_tsv))
        vectors = train_word_vectors(sentences, dim=config.out_dim, seed=config.seed, **(word2vec or {}))
        source = f"skip-gram on {len(sentences)} sentences ({sum(map(len, sentences))} tokens)"
        if save_vectors is not None:
            vectors.to_disk(save_vectors)
    vector_seconds = round(time.perf_counter() - start, 1)
    log(f"word vectors: {len(vectors.words)} words, {vectors.dim}-d, {source} ({vector_seconds} s)")
    dev = gold_mentions(kb, dev_path) if dev_path is not None else []
    encoder, report = train_bne(kb, vectors, config, dev, log)
    report.update({"word_vectors": source, "word_vector_seconds": vector_seconds, "kb": str(kb_path)})
    if vectors_path is None:
        report["word2vec"] = dict(word2vec or {})
    encoder.save(output, report)
    return report
