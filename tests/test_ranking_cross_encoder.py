"""The cross-encoder pair scorer (`linking.cross_encoder`) and its training (`training.cross_encoder_fit`):
batch-independent scores, saving and loading.

Fast: a tiny random BERT (1 layer, 32 wide) with the packaged MiniLM's tokenizer stands in for MiniLM, trained on
groups built from the MEDIC sample: a synonym as the mention, another synonym of its concept as the right name,
and names of other concepts, preferably sharing a word with the mention, as the wrong ones.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from spacy.util import registry

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.linking.cross_encoder import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CrossEncoderRanker,
    context_window,
    model_path,
)
from spacy_conceptnorm.linking.pair_scorer import RankingGroup
from spacy_conceptnorm.training.cross_encoder_fit import fit_cross_encoder
from spacy_conceptnorm.training.pair_scorer_fit import rerank_accuracy

from .ranking_groups import medic_groups

FIXTURES = Path(__file__).parent / "fixtures"
# a random model learns little without training its embeddings
SMALL = {"batch_size": 4, "negatives": 4, "lr": 5e-3, "max_length": 48, "freeze_embeddings": False}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matrices are too small to share among threads (on a busy machine, threads only wait)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A random 1-layer, 32-wide BERT with the packaged MiniLM's tokenizer, as a transformers directory."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = AutoTokenizer.from_pretrained(model_path(None))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def groups() -> list[RankingGroup]:
    return medic_groups(context=True)


@pytest.fixture(scope="module")
def trained(tiny_model, groups) -> tuple[CrossEncoderRanker, object, list[str]]:
    """The tiny cross-encoder trained on 60 groups for 8 epochs, the same 60 as dev (a random model learns to tell
    names apart, not to generalize: held-out groups would pick an epoch by chance); with its report and log."""
    lines: list[str] = []
    ranker = CrossEncoderRanker(tiny_model, **SMALL, epochs=8)
    report = fit_cross_encoder(ranker, groups[:60], groups[:60], seed=1, log=lines.append)
    return ranker, report, lines


def right_names_first(scorer: CrossEncoderRanker, groups: list[RankingGroup]) -> int:
    """How many groups have their right name scored highest, counted from the scores one by one."""
    scores = scorer.score([g.mention for g in groups], [g.names for g in groups], [g.context for g in groups])
    return sum(1 for g, s in zip(groups, scores) if g.labels[int(np.argmax(s))] == 1)


def test_training_makes_the_right_names_win(tiny_model, groups, trained):
    ranker, report, lines = trained
    train = groups[:60]
    # 8 names a group: a random model puts the right one first about 60 / 8 = 7.5 times; trained, 55 to 58 times
    # (fp32 and bf16, across seeds), so both bounds sit far from what any CPU gives
    before = right_names_first(CrossEncoderRanker(tiny_model, **SMALL), train)
    after = right_names_first(ranker, train)
    assert before <= 15
    assert after >= 48 and after - before >= 30
    # the report, one log line per epoch, and the kept weights are those of the best dev epoch
    assert report.epochs == 8 and len(report.history) == 8 and len(lines) == 8 and report.seconds > 0
    assert all("dev rerank accuracy" in line for line in lines)
    assert report.history[-1]["loss"] < 0.5 * report.history[0]["loss"]
    assert after / 60 == max(h["dev_accuracy"] for h in report.history) == rerank_accuracy(ranker, train)


@pytest.mark.parametrize("loss", ["listwise", "binary"])
def test_fit_is_seeded_and_keeps_frozen_embeddings(tiny_model, groups, loss):
    scores = []
    for _ in range(2):
        ranker = CrossEncoderRanker(tiny_model, **{**SMALL, "freeze_embeddings": True}, loss=loss, top_negatives=2)
        fit_cross_encoder(ranker, groups[:20], seed=3, log=lambda line: None)
        scores.append(np.concatenate(ranker.score([g.mention for g in groups], [g.names for g in groups])))
    assert np.array_equal(scores[0], scores[1])
    untrained = CrossEncoderRanker(tiny_model).network
    trained_weights = dict(ranker.network.named_parameters())
    for name, weight in untrained.named_parameters():
        assert torch.equal(weight, trained_weights[name]) == ("word_embeddings" in name)
    assert not np.array_equal(
        scores[0],
        np.concatenate(CrossEncoderRanker(tiny_model).score([g.mention for g in groups], [g.names for g in groups])),
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_scores_do_not_depend_on_batching_or_the_cache(trained, precision):
    ranker = trained[0]
    ranker.precision = precision
    ranker._cache.clear()
    try:
        mention, names, context = "breast cancer", ["cancer of the breast", "ovarian cancer"], "a [breast cancer] case"
        alone = ranker.score([mention], [names[:1]], [context])[0]
        ranker._cache.clear()
        long_name = "hereditary nonpolyposis colorectal cancer type 2 with extracolonic tumours of the brain"
        mixed = ranker.score(
            ["x", "a much longer mention of a syndrome than the others", mention, "breast cancer", ""],
            [[long_name, "a"], [], [names[1], long_name, names[0], ""], names[:1] * 9, ["b"]],
            ["", "", context, context, ""],
        )
        assert mixed[1].shape == (0,) and mixed[0].dtype == np.float32
        assert mixed[2][2] == alone[0] and np.all(mixed[3] == alone[0])  # bit for bit
        assert np.array_equal(ranker.score([mention], [names], [context])[0], mixed[2][[2, 0]])  # from the cache
    finally:
        ranker.precision = "auto"
        ranker._cache.clear()


def test_context_is_read_only_when_asked(tiny_model, groups):
    mention, names = groups[0].mention, groups[0].names
    contexts = [f"Patients with [{mention}] improved.", f"No family history of [{mention}] was found in the trial."]
    with_context = CrossEncoderRanker(tiny_model, context_chars=80)
    scores = with_context.score([mention, mention], [names, names], contexts)
    assert not np.array_equal(scores[0], scores[1])
    plain = CrossEncoderRanker(tiny_model)  # context_chars = 0
    scores = plain.score([mention, mention], [names, names], contexts)
    assert np.array_equal(scores[0], scores[1])
    assert np.array_equal(scores[0], plain.score([mention], [names])[0])


def test_context_window():
    context = "The patient, a 40 year old man with\n[breast cancer] and diabetes, was referred by his doctor."
    window = context_window("breast cancer", context, 40)
    assert window == "man with [breast cancer] and"  # 12 characters a side, partial words dropped
    assert len(context_window("breast cancer", context, 60)) <= 60
    assert context_window("breast cancer", context, 0) == ""
    assert context_window("x", "", 50) == ""
    # an unmarked mention is marked; a mention not in the text gets the start of the text, whole words
    assert context_window("diabetes", "cancer and diabetes were found", 30) == "and [diabetes] were"
    assert context_window("gout", "cancer and diabetes were found", 15) == "cancer and"


def test_save_and_load_give_identical_scores(tmp_path, groups, trained):
    ranker = trained[0]
    ranker.to_disk(tmp_path / "ce")
    files = {p.name for p in (tmp_path / "ce").iterdir()}
    assert {CONFIG_FILE, WEIGHTS_FILE, "config.json", "tokenizer.json"} <= files
    loaded = CrossEncoderRanker(context_chars=7, negatives=9).from_disk(tmp_path / "ce")
    assert loaded.config() == ranker.config()
    mentions, names, contexts = [g.mention for g in groups], [g.names for g in groups], [g.context for g in groups]
    ranker._cache.clear()
    expected = ranker.score(mentions, names, contexts)
    assert all(np.array_equal(a, b) for a, b in zip(expected, loaded.score(mentions, names, contexts)))
    # saving again replaces the directory whole
    ranker.to_disk(tmp_path / "ce")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failed_save_keeps_the_previous_one(tmp_path, trained, monkeypatch):
    ranker = trained[0]
    ranker.to_disk(tmp_path / "ce")
    before = (tmp_path / "ce" / WEIGHTS_FILE).read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ranker.tokenizer, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        ranker.to_disk(tmp_path / "ce")
    assert (tmp_path / "ce" / WEIGHTS_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ce"]


@pytest.mark.parametrize(
    "file,spoil",
    [
        (WEIGHTS_FILE, lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
        (WEIGHTS_FILE, lambda p: p.write_bytes(b"\x00" * 100)),
        (WEIGHTS_FILE, lambda p: p.unlink()),
        ("tokenizer.json", lambda p: p.write_text(p.read_text()[:1000])),
        ("tokenizer.json", lambda p: p.write_text('{"version": "1.0", "model": 3}')),
        ("config.json", lambda p: p.write_text("{not json")),
        (CONFIG_FILE, lambda p: p.write_text("{not json")),
        (CONFIG_FILE, lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "negatives": 0}))),
        (CONFIG_FILE, lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "version": 99}))),
        (CONFIG_FILE, lambda p: p.unlink()),
    ],
)
def test_missing_or_corrupt_files_raise_naming_the_file(tmp_path, trained, file, spoil):
    path = tmp_path / "ce"
    trained[0].to_disk(path)
    spoil(path / file)
    with pytest.raises(ConceptNormError, match=re.escape(file)):
        CrossEncoderRanker().from_disk(path)


def test_factory_and_settings(tiny_model):
    resolved = registry.resolve(
        {"x": {"@misc": "spacy_conceptnorm.cross_encoder_ranker.v1", "context_chars": 50, "negatives": 5}},
        validate=True,
    )["x"]
    assert isinstance(resolved, CrossEncoderRanker) and resolved.name == "cross_encoder"
    assert (resolved.context_chars, resolved.negatives, resolved.model, resolved.loss) == (
        50,
        5,
        "all-MiniLM-L6-v2",
        "listwise",
    )
    for bad in ({"epochs": 0}, {"negatives": 1.5}, {"batch_size": True}, {"precision": "fp8"}, {"loss": "hinge"}):
        with pytest.raises(ConceptNormError):
            CrossEncoderRanker(**bad)
    with pytest.raises(ConceptNormError, match="no-such-model"):
        CrossEncoderRanker(model=str(Path(__file__).parent / "no-such-model")).score(["a"], [["b"]])
