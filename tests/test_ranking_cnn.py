"""The triplet CNN pair scorer (`linking.cnn_ranker`) and its training (`training.cnn_fit`): exact
batch-independent scores, saving and loading.

Fast: small networks (32 filters) over the packaged MiniLM's input embeddings (loaded once per process), trained
on groups built from the MEDIC sample: a synonym as the mention, another synonym of its concept as the right
name, and names of other concepts, preferably sharing a word with the mention, as the wrong ones.
"""

import json
import random
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from spacy.util import registry

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.linking.cnn_ranker import CONFIG_FILE, WEIGHTS_FILE, CNNRanker
from spacy_conceptnorm.linking.pair_scorer import RankingGroup
from spacy_conceptnorm.training.cnn_fit import fit_cnn, pick_negatives
from spacy_conceptnorm.training.pair_scorer_fit import rerank_accuracy

from .ranking_groups import medic_groups

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = {"filters": 32, "kernel_sizes": [1, 2], "dim": 32, "batch_size": 16, "negatives": 4, "lr": 3e-3}


@contextmanager
def threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a busy machine, two threads spin and take many times longer."""
    with threads(1):
        yield


@pytest.fixture(scope="module")
def groups() -> list[RankingGroup]:
    return medic_groups()


@pytest.fixture(scope="module")
def trained(groups) -> tuple[CNNRanker, object, list[str]]:
    """A small CNN trained on 3/4 of the groups, the rest as dev; with its report and log lines."""
    lines: list[str] = []
    ranker = CNNRanker(**SMALL, epochs=4)
    report = fit_cnn(ranker, groups[:150], groups[150:], seed=1, log=lines.append)
    return ranker, report, lines


def test_training_makes_the_right_names_win(groups, trained):
    ranker, report, lines = trained
    untrained = CNNRanker(**SMALL)
    before = untrained.score([g.mention for g in groups], [g.names for g in groups])
    after = ranker.score([g.mention for g in groups], [g.names for g in groups])
    misranked = [i for i, g in enumerate(groups[:150]) if g.labels[int(np.argmax(before[i]))] == 0]
    assert len(misranked) > 20  # the untrained network is far from right
    fixed = [i for i in misranked if groups[i].labels[int(np.argmax(after[i]))] == 1]
    assert len(fixed) > 0.7 * len(misranked)
    assert rerank_accuracy(ranker, groups[:150]) > max(0.85, rerank_accuracy(untrained, groups[:150]) + 0.2)
    assert rerank_accuracy(ranker, groups[150:]) > rerank_accuracy(untrained, groups[150:])  # held-out groups too
    # the report, one log line per epoch, and the kept weights are those of the best dev epoch
    assert report.epochs == 4 and len(report.history) == 4 and len(lines) == 4 and report.seconds > 0
    assert all("dev rerank accuracy" in line for line in lines)
    assert report.history[-1]["loss"] < report.history[0]["loss"]
    assert rerank_accuracy(ranker, groups[150:]) == max(h["dev_accuracy"] for h in report.history)


def test_fit_is_seeded(groups):
    scores = []
    for _ in range(2):
        ranker = CNNRanker(**SMALL, epochs=1)
        fit_cnn(ranker, groups[:60], seed=3, log=lambda line: None)
        scores.append(np.concatenate(ranker.score([g.mention for g in groups], [g.names for g in groups])))
    assert np.array_equal(scores[0], scores[1])


@pytest.mark.parametrize("thread_count", [1, 2])
def test_scores_do_not_depend_on_batching_or_the_cache(trained, thread_count):
    ranker = trained[0]
    mention, names = "breast cancer", ["cancer of the breast", "ovarian cancer"]
    long_name = "hereditary nonpolyposis colorectal cancer type 2 with extracolonic tumours of the brain " * 3
    with threads(thread_count):
        ranker._cache.clear()
        alone = ranker.score([mention], [names[:1]])[0]
        ranker._cache.clear()
        mixed = ranker.score(
            ["x", "a much longer mention of a syndrome than the others", mention, ""],
            [[long_name, "a"], [], [names[1], long_name, names[0], ""], ["b"]],
        )
        cached = ranker.score([mention], [names])[0]
        ranker._cache.clear()
        many = ranker.score([mention] * 3, [[f"syndrome number {i} " * (i % 7) for i in range(300)] + names[:1]] * 3)
    assert mixed[1].shape == (0,) and mixed[0].dtype == np.float32
    assert mixed[2][2] == alone[0] and many[2][-1] == alone[0]  # bit for bit
    assert np.array_equal(cached, mixed[2][[2, 0]])  # from the cache
    assert mixed[2][2] > mixed[2][0]  # and the right name wins


def test_save_and_load_give_identical_scores(tmp_path, groups, trained):
    ranker = trained[0]
    ranker.to_disk(tmp_path / "cnn")
    assert sorted(p.name for p in (tmp_path / "cnn").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert (tmp_path / "cnn" / WEIGHTS_FILE).stat().st_size < 200_000  # frozen: no 30k x 384 embedding matrix
    loaded = CNNRanker(filters=8, dim=4).from_disk(tmp_path / "cnn")
    assert loaded.config() == ranker.config()
    mentions, names = [g.mention for g in groups], [g.names for g in groups]
    assert all(np.array_equal(a, b) for a, b in zip(ranker.score(mentions, names), loaded.score(mentions, names)))


def test_fine_tuned_embeddings_are_saved_as_changed_rows(tmp_path, groups):
    ranker = CNNRanker(**SMALL, epochs=1, fine_tune=True)
    fit_cnn(ranker, groups[:40], log=lambda line: None)
    ranker.to_disk(tmp_path / "cnn")
    size = (tmp_path / "cnn" / WEIGHTS_FILE).stat().st_size
    assert 200_000 < size < 30_522 * 384 * 4 / 4  # some rows, far from the whole matrix
    loaded = CNNRanker().from_disk(tmp_path / "cnn")
    assert loaded.fine_tune
    mentions, names = [g.mention for g in groups], [g.names for g in groups]
    assert all(np.array_equal(a, b) for a, b in zip(ranker.score(mentions, names), loaded.score(mentions, names)))


def test_missing_or_corrupt_files_raise_naming_the_file(tmp_path, trained):
    path = tmp_path / "cnn"
    trained[0].to_disk(path)
    weights, config = path / WEIGHTS_FILE, path / CONFIG_FILE
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConceptNormError, match=str(weights)):
        CNNRanker().from_disk(path)
    weights.write_bytes(b"\x00" * 100)
    with pytest.raises(ConceptNormError, match=str(weights)):
        CNNRanker().from_disk(path)
    weights.unlink()
    with pytest.raises(ConceptNormError, match=str(weights)):
        CNNRanker().from_disk(path)
    trained[0].to_disk(path)  # back to a good directory, then spoil the config
    config.write_text(json.dumps({**json.loads(config.read_text()), "filters": 64}))
    with pytest.raises(ConceptNormError, match=rf"E722\] {re.escape(str(weights))}"):  # shapes do not match weights
        CNNRanker().from_disk(path)
    config.write_text("{not json")
    with pytest.raises(ConceptNormError, match=str(config)):
        CNNRanker().from_disk(path)
    config.unlink()
    with pytest.raises(ConceptNormError, match=str(config)):
        CNNRanker().from_disk(path)
    assert not [p for p in path.iterdir() if p.name.startswith(".")]  # no temporary files left behind


def test_factory_and_settings():
    resolved = registry.resolve(
        {"x": {"@misc": "spacy_conceptnorm.cnn_ranker.v1", "kernel_sizes": [2, 4], "epochs": 3, "negatives": 5}},
        validate=True,
    )["x"]
    assert isinstance(resolved, CNNRanker) and resolved.name == "cnn"
    assert (resolved.kernel_sizes, resolved.epochs, resolved.negatives, resolved.dim) == ([2, 4], 3, 5, 128)
    for bad in ({"filters": 0}, {"kernel_sizes": []}, {"negatives": 1.5}, {"epochs": True}):
        with pytest.raises(ConceptNormError, match=rf"E721\] The CNN ranker's {next(iter(bad))} must be"):
            CNNRanker(**bad)
    with pytest.raises(ConceptNormError, match="E720.*no-such-model"):
        CNNRanker(model=str(Path(__file__).parent / "no-such-model")).score(["a"], [["b"]])


def test_mining_takes_the_closest_wrong_names_first():
    wrong = ["w0", "w1", "w2", "w3", "w4", "w5"]  # closest to the mention first
    for seed in range(20):
        chosen = pick_negatives(wrong, 4, 2, random.Random(seed))
        assert chosen[:2] == ["w0", "w1"] and len(chosen) == 4 and len(set(chosen)) == 4
        assert set(chosen[2:]) <= {"w2", "w3", "w4", "w5"}
    drawn = {name for seed in range(20) for name in pick_negatives(wrong, 3, 0, random.Random(seed))}
    assert "w0" in drawn and "w5" in drawn  # without mining, any wrong name can be drawn
    assert sorted(pick_negatives(["a", "b"], 5, 2, random.Random(0))) == ["a", "b"]  # fewer wrong names than asked
    assert pick_negatives(["a", "b", "c"], 5, 4, random.Random(0)) == ["a", "b", "c"]
