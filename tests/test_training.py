"""Triplet training: training texts, batch construction, losses, the runner (checkpoint, resume, outputs), CLI.

Fast: a knowledge base of 30 MEDIC concepts (the sample's concepts that the NCBI fixtures link to, and three
more), a tiny random BERT with the MiniLM tokenizer for the runner, the trigram stand-in encoder for the
strategies that search, and the real MiniLM only for the test that training improves a held-out synonym.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.miners import BatchHardMiner, MultiSimilarityMiner
from spacy.util import registry
from typer.testing import CliRunner

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.io.files import write_dir_atomically
from spacy_conceptnorm.kb.knowledge_base import Concept, KnowledgeBase, load_kb
from spacy_conceptnorm.ml.name_encoder import NameEncoder
from spacy_conceptnorm.training.budget import SafetyStopWarning
from spacy_conceptnorm.training.data import build_training_data, load_hierarchy, mention_pairs
from spacy_conceptnorm.training.encoder_settings import TrainingSettings, read_settings
from spacy_conceptnorm.training.losses import batch_hard_triplets, multi_similarity_pairs, pair_masks
from spacy_conceptnorm.training.samplers import STRATEGIES, Batch, BatchBuilder, Group, TripletSampler
from spacy_conceptnorm.training.trainer import (
    CHECKPOINT,
    STATE_FILE,
    TrainingState,
    batch_loss,
    load_training_config,
    planned_steps,
    schedule_length,
    train,
)

from .fake_encoder import TrigramEncoder

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = Path(__file__).parents[1] / "configs" / "train_xu_bethard.cfg"
EXTRA = ("D005359", "D008107", "C536819")  # one many-named concept, one 8-named, one with a single name
LOSSES = (
    "spacy_conceptnorm.batch_hard_soft_margin.v1",
    "spacy_conceptnorm.triplet_margin.v1",
    "spacy_conceptnorm.multi_similarity.v1",
)
# child -> parents, CTD style (MESH: prefixes, which the KB resolves to MEDIC 2012's bare ids)
HIERARCHY = {"D003110": ["D015179"], "D015179": ["D009369"], "D012878": ["D009369"], "D010051": ["D009369"],
             "D001943": ["D009369"]}  # fmt: skip


def _gold_ids() -> set[str]:
    ids = set()
    for name in ("ncbi_train_sample.txt", "ncbi_test_sample.txt"):
        for line in (FIXTURES / name).read_text().splitlines():
            cols = line.split("\t")
            if len(cols) >= 6:
                ids.update(x for x in cols[5].replace("+", "|").split("|") if x)
    return ids


@pytest.fixture(scope="module")
def tiny_kb_path(tmp_path_factory) -> Path:
    """30 concepts of the MEDIC sample, in MEDIC format."""
    wanted = _gold_ids() | set(EXTRA)
    lines = [
        line
        for line in (FIXTURES / "medic_sample.txt").read_text().splitlines()
        if wanted & {("OMIM:" + i if i.isdigit() else i) for i in line.partition("||")[0].split("|")}
    ]
    path = tmp_path_factory.mktemp("kb") / "medic_tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    assert 28 <= len(load_kb(path)) <= 32
    return path


@pytest.fixture(scope="module")
def hierarchy_path(tmp_path_factory) -> Path:
    rows = ["# Fields:", "# DiseaseName\tDiseaseID\tAltDiseaseIDs\tDefinition\tParentIDs"]
    rows += [f"name {c}\tMESH:{c}\t\t\t{'|'.join('MESH:' + p for p in ps)}" for c, ps in HIERARCHY.items()]
    rows += ["Unknown\tMESH:D999999\t\t\tMESH:D009369"]  # not in the KB: dropped
    path = tmp_path_factory.mktemp("ctd") / "ctd.tsv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def overrides(tiny_kb_path, tiny_bert, hierarchy_path) -> dict:
    return {
        "paths.kb": str(tiny_kb_path),
        "paths.train": str(FIXTURES / "ncbi_train_sample.txt"),
        "paths.dev": str(FIXTURES / "ncbi_test_sample.txt"),
        "paths.hierarchy": str(hierarchy_path),
        "encoder.model": str(tiny_bert),
        "training.batch_size": 32,
        "training.micro_batch": 16,
        "training.learning_rate": 1e-3,
        "training.max_epochs": 2,
        "training.schedule_steps": 0,
        "training.max_minutes": 0,
        "training.patience": 0,
        "training.threads": 1,
    }


def shared_name_kb() -> KnowledgeBase:
    """'hh' names two concepts, as MEDIC's shared names do."""
    return KnowledgeBase.from_records([
        (Concept("A", "hemochromatosis"), ["hh", "iron storage disorder"]),
        (Concept("B", "hypogonadotropic hypogonadism"), ["hh", "gonadotropin deficiency"]),
        (Concept("C", "liver disease"), ["hepatopathy"]),
    ])  # fmt: skip


def positives_in_batch(batch: Batch) -> list[bool]:
    same = batch.same_concept()
    same.fill_diagonal_(False)
    return [bool(same[a].any()) for a in batch.anchors]


# --- training texts ---------------------------------------------------------------------------------------------
def test_train_o_texts_and_anchors(tiny_kb_path):
    kb = load_kb(tiny_kb_path)
    data = build_training_data(kb, "O")
    assert data.texts == kb.names("ontology")
    assert len(set(data.texts)) == len(data.texts)
    for tid, text in enumerate(data.texts):
        assert {data.concept_ids[lab] for lab in data.text_labels[tid]} == set(kb.concepts_for(text, 1))
    single = data.label("C536819")
    assert len(data.concept_texts[single]) == 1
    assert all(label != single for _, label in data.anchors)  # no positive exists: never an anchor
    assert all(len(data.positives(t, lab)) >= 1 and lab in data.text_labels[t] for t, lab in data.anchors)


def test_train_od_adds_mentions_at_one_third(tiny_kb_path):
    kb = load_kb(tiny_kb_path)
    data = build_training_data(kb, "OD", FIXTURES / "ncbi_train_sample.txt", 1 / 3)
    pairs = mention_pairs(kb, FIXTURES / "ncbi_train_sample.txt")
    assert ("colon and some other cancers", "D003110") not in pairs  # composite mention skipped
    assert ("apc", "D011125") in pairs  # normalized, as the search sees it
    domain = data.anchors[data.n_ontology_anchors :]
    assert len(domain) == round(data.n_ontology_anchors / 3)
    assert {(data.texts[t], data.concept_ids[lab]) for t, lab in domain} <= set(pairs)
    apc = data.texts.index("apc")
    assert data.label("D011125") in data.text_labels[apc]


def test_shared_name_is_positive_of_each_concept():
    data = build_training_data(shared_name_kb(), "O")
    hh = data.texts.index("hh")
    assert {data.concept_ids[lab] for lab in data.text_labels[hh]} == {"A", "B"}
    assert (hh, data.label("A")) in data.anchors and (hh, data.label("B")) in data.anchors
    builder = BatchBuilder(data, 8)
    for text in ("hh", "iron storage disorder", "gonadotropin deficiency", "hepatopathy"):
        builder.add_group(data.texts.index(text), data.label("C"), Group([]))
    batch = builder.take()
    same = batch.same_concept()
    pos = {name: i for i, name in enumerate(data.texts[t] for t in batch.texts)}
    assert same[pos["hh"], pos["iron storage disorder"]] and same[pos["hh"], pos["gonadotropin deficiency"]]
    assert not same[pos["iron storage disorder"], pos["gonadotropin deficiency"]]
    assert not same[pos["hh"], pos["hepatopathy"]]


# --- batch construction ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_batches_give_every_anchor_a_positive(strategy, tiny_kb_path, hierarchy_path):
    kb = load_kb(tiny_kb_path)
    data = build_training_data(kb, "OD", FIXTURES / "ncbi_train_sample.txt")
    sampler = TripletSampler(strategy, positives=2, related=2, negatives=3, neighbours=3, hierarchy=str(hierarchy_path))
    sampler.setup(data)
    batches = list(sampler.batches(1, 0, 24, TrigramEncoder()))
    assert all(0 < len(b) <= 24 and len(set(b.texts)) == len(b) for b in batches)
    assert all(all(positives_in_batch(b)) for b in batches)
    anchored = {(b.texts[a]) for b in batches for a in b.anchors}
    assert anchored == {t for t, _ in data.anchors}
    again = list(sampler.batches(1, 0, 24, TrigramEncoder()))
    assert [b.texts for b in again] == [b.texts for b in batches]  # same seed and epoch: same batches
    assert [b.texts for b in sampler.batches(2, 0, 24, TrigramEncoder())] != [b.texts for b in batches]


def test_parents_join_as_positives_and_siblings_as_negatives(tiny_kb_path, hierarchy_path):
    kb = load_kb(tiny_kb_path)
    assert load_hierarchy(kb, hierarchy_path)["D003110"] == ("D015179",)
    data = build_training_data(kb, "O")
    colon, colorectal = data.label("D003110"), data.label("D015179")
    anchor = data.concept_texts[colon][0]
    rng = random.Random(0)

    parents = TripletSampler("random+parents", related=3, hierarchy=str(hierarchy_path))
    parents.setup(data)
    group = parents.group(anchor, colon, rng, None)
    assert len(group.extra) == 3 and all(colorectal in data.text_labels[t] for t in group.extra)
    builder = BatchBuilder(data, 16)
    builder.add_group(anchor, colon, group)
    batch = builder.take()
    same = batch.same_concept()
    extra_pos = [batch.texts.index(t) for t in group.extra]
    assert all(same[batch.texts.index(anchor), p] for p in extra_pos)  # trained as positives of the anchor

    siblings = TripletSampler("resampling+siblings", related=2, negatives=0, hierarchy=str(hierarchy_path))
    siblings.setup(data)
    assert set(siblings.siblings[data.label("D012878")]) == {data.label(c) for c in ("D015179", "D010051", "D001943")}
    skin = data.label("D012878")
    group = siblings.group(data.concept_texts[skin][0], skin, rng, siblings.nearest(TrigramEncoder()))
    sibling_labels = set(siblings.siblings[skin])
    assert len(group.negatives) == 2 and all(data.text_labels[t] & sibling_labels for t in group.negatives)


def test_resampling_negatives_are_ranked_above_the_first_correct_name(tiny_kb_path):
    data = build_training_data(load_kb(tiny_kb_path), "O")
    sampler = TripletSampler("resampling", negatives=50, search_k=50)
    sampler.setup(data)
    ranked = sampler.nearest(TrigramEncoder())
    checked = 0
    for text, label in data.anchors:
        group = sampler.group(text, label, random.Random(0), ranked)
        order = [int(t) for t in ranked[text] if t != text]
        positive = group.positives[0]
        if positive in order:  # the closest correct name, with every name above it a negative
            assert label in data.text_labels[positive]
            assert group.negatives == order[: order.index(positive)]
            assert all(label not in data.text_labels[t] for t in group.negatives)
            checked += bool(group.negatives)
    assert checked > 5


def test_anchors_per_epoch_draws_a_new_subset_each_epoch(tiny_kb_path):
    sampler = TripletSampler("random", anchors_per_epoch=50)
    sampler.setup(build_training_data(load_kb(tiny_kb_path), "O"))

    def anchors(epoch):
        return [(b.texts[a], b.labels[a]) for b in sampler.batches(epoch, 0, 16) for a in b.anchors]

    first, second = anchors(1), anchors(2)
    assert len(first) == len(second) == 50
    assert set(first) != set(second)
    assert sampler.estimate_batches(16) == -(-50 // 8)


def test_batch_size_smaller_than_a_group_is_refused(tiny_kb_path):
    sampler = TripletSampler("dynamic", positives=4, neighbours=4)
    sampler.setup(build_training_data(load_kb(tiny_kb_path), "O"))
    with pytest.raises(ConceptNormError, match=r"batch_size 6 is too small for the 'dynamic' sampler: .* 9 names"):
        next(sampler.batches(1, 0, 6, TrigramEncoder()))


# --- losses ---------------------------------------------------------------------------------------------------------
def _labelled_batch(seed=0, n=48, classes=7):
    g = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(n, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, classes, (n,), generator=g)
    labels[0] = 99  # an anchor without a positive
    return embeddings, labels, labels[:, None] == labels[None, :]


@pytest.mark.parametrize("normalize", [True, False])
def test_batch_hard_mining_matches_pml_with_single_labels(normalize):
    embeddings, labels, same = _labelled_batch()
    distance = LpDistance(normalize_embeddings=normalize)
    expected = BatchHardMiner(distance=distance)(embeddings, labels)
    mined = batch_hard_triplets(distance(embeddings.detach()), *pair_masks(same))
    assert 0 not in mined[0].tolist()
    for a, b in zip(expected, mined):
        assert torch.equal(a, b)


def test_multi_similarity_mining_matches_pml_with_single_labels():
    embeddings, labels, same = _labelled_batch(1)
    a1, p, a2, n = MultiSimilarityMiner(epsilon=0.1)(embeddings, labels)
    m1, mp, m2, mn = multi_similarity_pairs(CosineSimilarity()(embeddings.detach()), *pair_masks(same), 0.1)
    assert sorted(zip(a1.tolist(), p.tolist())) == sorted(zip(m1.tolist(), mp.tolist()))
    assert sorted(zip(a2.tolist(), n.tolist())) == sorted(zip(m2.tolist(), mn.tolist()))
    assert len(m2) > 0


def test_batch_hard_soft_margin_is_xu_bethard_eq6():
    embeddings, labels, same = _labelled_batch(2)
    loss = registry.misc.get(LOSSES[0])(normalize=False)(embeddings, same)
    dist = torch.cdist(embeddings, embeddings)
    terms = []
    for i in range(len(labels)):
        pos = [dist[i, j] for j in range(len(labels)) if j != i and labels[j] == labels[i]]
        neg = [dist[i, j] for j in range(len(labels)) if labels[j] != labels[i]]
        if pos and neg:
            terms.append(torch.log1p(torch.exp(max(pos) - min(neg))))
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_computes_and_backpropagates(name):
    embeddings, _, same = _labelled_batch(3)
    loss = registry.misc.get(name)()(embeddings, same)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss) and loss.item() > 0
    assert torch.isfinite(embeddings.grad).all() and embeddings.grad.abs().sum() > 0
    no_pairs = registry.misc.get(name)()(torch.randn(3, 4, requires_grad=True), torch.eye(3, dtype=torch.bool))
    assert no_pairs.item() == 0.0  # nothing to mine: zero, not an error


# --- learning ---------------------------------------------------------------------------------------------------
HELD_OUT = {  # one synonym per concept, not trained on
    "D006432": "Hemochromatoses, Familial",
    "D010661": "Classical Phenylketonuria",
    "D011125": "Adenomatous Polyposis Coli, Familial",
    "D015179": "Colorectal Cancer",
    "D006527": "Copper Storage Disease",
    "D010505": "Benign Paroxysmal Peritonitis",
}


@pytest.mark.slow
def test_training_steps_lower_the_loss_and_rank_a_held_out_synonym_higher(tiny_kb_path):
    kb = load_kb(tiny_kb_path)
    norm = kb.normalizer
    held = {norm(text): cid for cid, text in HELD_OUT.items()}
    assert all(cid in kb.concepts_for(text) for text, cid in held.items())
    kb.remove_names([(text, None) for text in held], "ontology")
    data = build_training_data(kb, "O")
    assert not set(held) & set(data.texts)
    encoder = NameEncoder(max_length=16)
    torch.manual_seed(0)

    def margins() -> np.ndarray:
        """Per held-out synonym: best cosine to its concept's names minus best cosine to another concept's."""
        names = encoder.encode(data.texts)
        queries = encoder.encode(list(held))
        sims = queries @ names.T
        out = []
        for q, cid in enumerate(held.values()):
            mine = np.array([data.label(cid) in labels for labels in data.text_labels])
            out.append(sims[q][mine].max() - sims[q][~mine].max())
        return np.array(out)

    sampler = TripletSampler("random")
    sampler.setup(data)
    loss_fn = registry.misc.get(LOSSES[0])()
    lengths = np.array([len(t) for t in data.texts])
    probe = next(sampler.batches(99, 0, 64))
    optimizer = torch.optim.AdamW(encoder.model.parameters(), lr=5e-5)

    def probe_loss() -> float:
        encoder.model.eval()
        with torch.no_grad():
            return batch_loss(encoder, loss_fn, probe, data.texts, lengths, 64).item()

    before_margin, before_loss = margins(), probe_loss()
    encoder.model.train()
    steps = 0
    for epoch in (1, 2):
        for batch in sampler.batches(epoch, 0, 32):
            optimizer.zero_grad()
            batch_loss(encoder, loss_fn, batch, data.texts, lengths, 32).backward()
            optimizer.step()
            steps += 1
            if steps == 16:
                break
    after_margin, after_loss = margins(), probe_loss()
    assert after_loss < before_loss - 0.03
    assert after_margin.mean() > before_margin.mean() + 0.05
    assert (after_margin > before_margin).sum() >= 4  # of 6; "copper storage disease" needs more than spelling
    assert (after_margin > 0).sum() >= (before_margin > 0).sum()  # held-out synonyms ranked first


# --- the runner ---------------------------------------------------------------------------------------------------
def test_train_writes_loadable_models_and_resume_continues_an_interrupted_run(tmp_path, overrides, monkeypatch):
    from spacy_conceptnorm.training import trainer

    real_save = trainer.save_checkpoint

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt  # killed right after the first epoch's checkpoint

    out = tmp_path / "run"
    monkeypatch.setattr(trainer, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train(CONFIG, out, overrides)
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    first = json.loads((out / "model-last" / "metrics.json").read_text())
    assert [h["epoch"] for h in first["history"]] == [0, 1] and first["steps"] > 0
    for name in ("model-best", "model-last"):
        assert (out / name / "config.json").exists() and (out / name / "training.cfg").exists()
        vectors = NameEncoder(str(out / name)).encode(["liver disease", "hepatopathy"])
        assert vectors.shape == (2, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary directory left

    args = [str(CONFIG), "--output", str(out), "--resume"]
    for key, value in overrides.items():
        args += [f"--{key}", str(value)]
    resumed = CliRunner().invoke(app, ["train", *args])
    assert resumed.exit_code == 0, resumed.output
    second = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in second["history"]] == [0, 1, 2]
    assert second["history"][:2] == first["history"]
    assert second["steps"] == first["steps"] + second["history"][2]["batches"]

    straight = tmp_path / "straight"  # the same two epochs without interruption: the same losses and weights
    metrics = train(CONFIG, straight, overrides)
    assert [h["step"] for h in metrics["history"]] == [h["step"] for h in second["history"]]
    dev = ("dev_acc1", "dev_acc5")  # each epoch's model scored alike with and without the interruption
    assert [[h[k] for k in dev] for h in metrics["history"]] == [[h[k] for k in dev] for h in second["history"]]
    assert np.isclose(metrics["history"][2]["loss"], second["history"][2]["loss"], rtol=1e-4)
    a, b = NameEncoder(str(out / "model-last")).model, NameEncoder(str(straight / "model-last")).model
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_resumed_run_keeps_the_thread_count_it_started_with(tmp_path, overrides):
    out = tmp_path / "run"
    train(CONFIG, out, {**overrides, "training.max_epochs": 1})  # on one thread (overrides)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # resumed with threads = 0 (torch's two): gradients differ across counts, so it keeps the first run's one
        train(CONFIG, out, {**overrides, "training.threads": 0}, resume=True)
        assert torch.get_num_threads() == 2  # restored after the run
    finally:
        torch.set_num_threads(before)
    state = torch.load(out / CHECKPOINT / STATE_FILE, weights_only=True)
    assert state["epoch"] == 2 and state["threads"] == 1


# the keys every version's checkpoint holds for the run's state, beside optimizer, scheduler, rng and threads
STATE_KEYS = {"epoch", "step", "history", "best", "best_epoch", "bad_epochs", "elapsed", "candidates"}


def test_training_state_reads_and_writes_the_checkpoint_format():
    saved = {"epoch": 2, "step": 70, "history": [{"epoch": 0, "step": 0, "dev_acc1": 0.5}], "best": 0.5,
             "best_epoch": 0, "bad_epochs": 2, "elapsed": 12.5, "candidates": ["D1", "D2"],
             "optimizer": {}, "scheduler": {}, "rng": {}, "threads": 1}  # fmt: skip
    state = TrainingState.from_dict(saved)
    assert (state.epoch, state.step, state.best, state.bad_epochs, state.candidates) == (2, 70, 0.5, 2, ["D1", "D2"])
    assert state.to_dict() == {k: saved[k] for k in STATE_KEYS}
    assert set(TrainingState().to_dict()) == STATE_KEYS
    with pytest.raises(KeyError):
        TrainingState.from_dict({k: v for k, v in saved.items() if k != "bad_epochs"})


def test_a_checkpoint_without_a_state_key_is_refused(tmp_path, overrides):
    train(CONFIG, tmp_path, {**overrides, "training.max_epochs": 1})
    saved = torch.load(tmp_path / CHECKPOINT / STATE_FILE, weights_only=True)
    assert STATE_KEYS | {"optimizer", "scheduler", "rng", "threads"} == set(saved)
    del saved["best_epoch"]
    torch.save(saved, tmp_path / CHECKPOINT / STATE_FILE)
    with pytest.raises(ConceptNormError, match="best_epoch"):
        train(CONFIG, tmp_path, overrides, resume=True)


def test_the_safety_stop_ends_the_run_with_a_warning(tmp_path, overrides):
    """max_minutes is no budget: a run it ends says so, and records why it stopped."""
    with pytest.warns(SafetyStopWarning, match=r"\[training\] max_minutes = 0.001\) after 1 step of the \d+ planned"):
        metrics = train(CONFIG, tmp_path, {**overrides, "training.max_minutes": 0.001})  # set-up alone takes longer
    assert metrics["steps"] == 1 and metrics["stopped"] == "max_minutes 0.001 reached (safety stop)"
    assert json.loads((tmp_path / "metrics.json").read_text())["stopped"] == metrics["stopped"]


def test_the_budget_is_steps_and_the_schedule_may_run_longer():
    settings = TrainingSettings(max_epochs=2, max_steps=0)
    assert planned_steps(settings, 36) == schedule_length(settings, 36) == 72
    assert planned_steps(settings.model_copy(update={"max_steps": 50}), 36) == 50
    longer = settings.model_copy(update={"max_epochs": 1, "schedule_steps": 2400})
    assert (planned_steps(longer, 737), schedule_length(longer, 737)) == (737, 2400)


def test_a_run_cut_at_its_budget_trains_the_steps_of_a_longer_schedule(tmp_path, overrides, monkeypatch):
    """One epoch with `schedule_steps` = a two-epoch run's schedule gives that run's first epoch, weight for weight."""
    from spacy_conceptnorm.training import trainer

    real_save = trainer.save_checkpoint

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):  # two epochs, the schedule over max_steps = 50, killed after the first
        train(CONFIG, tmp_path / "long", {**overrides, "training.max_steps": 50})
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    metrics = train(CONFIG, tmp_path / "cut", {**overrides, "training.max_epochs": 1, "training.schedule_steps": 50})
    assert metrics["stopped"] == "max_epochs reached" and metrics["steps"] < 50
    a = NameEncoder(str(tmp_path / "long" / "model-last")).model.state_dict()
    b = NameEncoder(str(tmp_path / "cut" / "model-last")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["train_xu_bethard.cfg", "train_dilbert.cfg", "train_coderpp.cfg"])
def test_encoder_configs_budget_steps_without_a_clock(name):
    config = load_training_config(CONFIG.parent / name)
    plain = {k: v for k, v in config["training"].items() if not isinstance(v, dict)}
    settings = read_settings(TrainingSettings, plain, "training")
    assert settings.max_minutes == 0  # the safety stop off: every machine trains the same steps
    if name == "train_xu_bethard.cfg":  # `run all`'s: one epoch, the learning rate declining as over 2,400 steps
        assert (settings.max_epochs, settings.max_steps, settings.schedule_steps) == (1, 0, 2400)


def test_model_best_stays_the_starting_model_when_no_epoch_beats_it(tmp_path, overrides, monkeypatch):
    from spacy_conceptnorm.training import trainer

    scores = iter([0.9, 0.5, 0.6])  # epoch 0 (the starting model), then two worse epochs
    monkeypatch.setattr(trainer.DevEvaluator, "__call__", lambda self, encoder: {"dev_acc1": next(scores)})
    metrics = train(CONFIG, tmp_path, overrides)
    assert metrics["best_epoch"] == 0 and metrics["best_dev_acc1"] == 0.9
    start = NameEncoder(overrides["encoder.model"]).model.state_dict()
    best = NameEncoder(str(tmp_path / "model-best")).model.state_dict()
    last = NameEncoder(str(tmp_path / "model-last")).model.state_dict()
    assert all(torch.equal(start[k], best[k]) for k in start)
    assert not all(torch.equal(start[k], last[k]) for k in start)


@pytest.mark.parametrize("strategy,loss", [("dynamic", LOSSES[2]), ("random+parents", LOSSES[1])])
def test_other_recipes_train(tmp_path, overrides, strategy, loss):
    metrics = train(CONFIG, tmp_path, {**overrides, "training.sampler.strategy": strategy,
                                       "training.loss": {"@misc": loss}, "training.max_epochs": 1})  # fmt: skip
    assert metrics["steps"] == metrics["history"][1]["batches"] > 0 and np.isfinite(metrics["history"][1]["loss"])
    start = NameEncoder(overrides["encoder.model"]).model.state_dict()
    last = NameEncoder(str(tmp_path / "model-last")).model.state_dict()
    assert not all(torch.equal(start[k], last[k]) for k in start)  # the recipe's loss moved the weights


def test_interrupted_write_leaves_the_previous_directory(tmp_path):
    target = tmp_path / "model-best"
    write_dir_atomically(target, lambda p: (p / "weights").write_text("old"))

    def fails(p: Path) -> None:
        (p / "weights").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_dir_atomically(target, fails)
    assert (target / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model-best"]


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"training.epochs": 3}, "unknown key"),
        ({"training.batch_size": "many"}, "batch_size"),
        ({"training.batch_size": True}, r"\[training\] batch_size = True: Input should be a valid integer"),
        ({"training.max_epochs": 0}, "max_epochs = 0: Input should be greater than or equal to 1"),
        ({"training.dev.candidates": -1}, r"\[training.dev\] candidates = -1"),
        ({"training.sampler.strategy": "hardest"}, "sampling strategy"),
        ({"training.train_on": "D"}, "train_on"),
        ({"training.dev.strategy": "X-T"}, "search strategy"),
        ({"training.loss": {"@misc": "spacy_conceptnorm.no_such_loss.v1"}}, "training.loss"),
        ({"paths.hierarchy": None, "training.sampler.strategy": "random+parents"}, "hierarchy"),
        ({"nosection.key": 1}, "Invalid training config"),
    ],
)
def test_bad_config_raises(tmp_path, overrides, bad, match):
    with pytest.raises(ConceptNormError, match=match):
        train(CONFIG, tmp_path, {**overrides, **bad})


def test_resume_without_checkpoint_raises(tmp_path, overrides):
    with pytest.raises(ConceptNormError, match="no checkpoint"):
        train(CONFIG, tmp_path, overrides, resume=True)


KILLED_TRAINING = """
import json, os, signal, sys
from pathlib import Path
from spacy_conceptnorm.training import trainer

out, overrides, where = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
if where == "swap":  # between moving the epoch-1 checkpoint aside and moving the epoch-2 one in
    rename = Path.rename

    def killing_rename(self, target):
        result = rename(self, target)
        if self.name == "checkpoint" and ".old-" in Path(target).name:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    Path.rename = killing_rename
else:  # at the second training step of the second epoch
    save, loss, counts = trainer.save_checkpoint, trainer.batch_loss, {"saved": 0, "steps": 0}

    def counting_save(*args, **kwargs):
        save(*args, **kwargs)
        counts["saved"] += 1

    def killing_loss(*args, **kwargs):
        counts["steps"] += counts["saved"] == 1
        if counts["steps"] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return loss(*args, **kwargs)

    trainer.save_checkpoint, trainer.batch_loss = counting_save, killing_loss
trainer.train(Path(sys.argv[4]), out, overrides)
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["swap", "step"])
def test_train_killed_then_resumed_gives_the_weights_of_an_uninterrupted_run(tmp_path, overrides, where):
    import subprocess
    import sys

    straight = tmp_path / "straight"
    train(CONFIG, straight, overrides)
    out = tmp_path / "killed"
    args = [sys.executable, "-c", KILLED_TRAINING, str(out), json.dumps(overrides), where, str(CONFIG)]
    killed = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "checkpoint").exists() != (where == "swap")  # the swap killed between its two renames
    metrics = train(CONFIG, out, overrides, resume=True)
    assert [h["epoch"] for h in metrics["history"]] == [0, 1, 2]
    a = NameEncoder(str(out / "model-last")).model.state_dict()
    b = NameEncoder(str(straight / "model-last")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)  # bitwise
