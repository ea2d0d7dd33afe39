"""BNE (Phan et al. 2019): vocabulary, network, objectives, training, save/load, evaluations, CLI, registry.

Everything runs on the MEDIC sample with tiny networks and random word vectors, in seconds."""

import json
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from spacy.tokens import Span
from typer.testing import CliRunner

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.evaluation.bne_metrics import (
    BM25,
    nearest_name_accuracy,
    synonym_closeness,
    synonym_retrieval_map,
)
from spacy_conceptnorm.kb.knowledge_base import Concept, KnowledgeBase
from spacy_conceptnorm.kb.synonyms import held_out_concepts, synonym_sets
from spacy_conceptnorm.ml.bne import BNEEncoder
from spacy_conceptnorm.ml.bne.vocab import Vocab
from spacy_conceptnorm.training.bne import TrainConfig, build_encoder, concept_vectors, contextual_vectors, train_bne
from spacy_conceptnorm.training.bne_data import SynonymData
from spacy_conceptnorm.training.bne_objectives import bne_losses, draw_negatives, logistic
from spacy_conceptnorm.training.word_vectors import WordVectors

TINY = {"char_dim": 8, "char_hidden": 8, "word_hidden": 12, "out_dim": 16, "dropout": 0.0}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny networks: one torch thread is fastest, and the test machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_vectors(kb: KnowledgeBase, dim: int = 16, seed: int = 0) -> WordVectors:
    words = sorted({w for name in kb.names() for w in name.split()})
    return WordVectors(words, np.random.default_rng(seed).normal(size=(len(words), dim)).astype(np.float32))


@pytest.fixture(scope="module")
def sample_kb(fixtures):
    from spacy_conceptnorm.kb.knowledge_base import load_kb

    return load_kb(fixtures / "medic_sample.txt")


@pytest.fixture(scope="module")
def trained(sample_kb):
    config = TrainConfig(epochs=1, pairs_per_epoch=256, holdout=20, **TINY)
    encoder, report = train_bne(sample_kb, random_vectors(sample_kb), config, log=lambda _: None)
    return encoder, report


def test_vocab_normalizes_names_and_marks_words_without_vectors():
    vocab = Vocab.build(["breast", "cancer"], ["breast cancer"])
    raw, key = vocab.batch(["Breast-Cancer", "breast cancer"]), vocab.batch(["breast cancer"])
    assert raw.tokens[0].tolist() == raw.tokens[1].tolist()  # punctuation and case do not matter
    assert key.word_ids.tolist() == [0, 1, 2]  # row 0 is the empty word; "breast" is vector 1, "cancer" 2
    unknown = vocab.batch(["tumour"])
    assert unknown.word_ids.tolist() == [0, 0]  # no pre-trained vector: the zero row
    assert 1 in unknown.char_ids[1].tolist()  # "m", "u" etc. were never seen: the unknown character id


def test_word_vectors_round_trip_and_malformed_file(tmp_path):
    vectors = WordVectors(["a", "b"], np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32))
    vectors.to_disk(tmp_path / "v.txt")
    assert (tmp_path / "v.txt").read_text().splitlines()[0] == "2 2"
    back = WordVectors.from_disk(tmp_path / "v.txt")
    assert back.words == ["a", "b"] and np.array_equal(back.vectors, vectors.vectors)
    (tmp_path / "bad.txt").write_text("2 2\na 0.5 -1.0\nb 2.0\n")
    with pytest.raises(ConceptNormError, match=r"bad\.txt:3"):
        WordVectors.from_disk(tmp_path / "bad.txt")


def test_word_vector_text_keeps_each_name_a_sentence_of_its_own(sample_kb, fixtures):
    from spacy_conceptnorm.training.word_vectors import text_sentences

    abstracts = list(text_sentences([fixtures / "ncbi_train_sample.txt"]))
    names = list(text_sentences(kb_path=fixtures / "medic_sample.txt"))
    definitions = list(text_sentences(ctd_tsv=fixtures / "ctd_diseases_sample.tsv"))
    assert names == [name.split() for name in sample_kb.names()]  # never two synonyms in one context window
    assert ["tumors", "or", "cancer", "of", "the", "human", "breast"] in definitions
    assert all(w == w.lower() and w.isalnum() for sentence in abstracts for w in sentence)
    assert len(abstracts) > 10


def test_train_word_vectors_with_gensim():
    pytest.importorskip("gensim")
    from spacy_conceptnorm.training.word_vectors import train_word_vectors

    sentences = [["breast", "cancer"], ["colon", "cancer"], ["breast", "tumor"]] * 5
    vectors = train_word_vectors(sentences, dim=8, epochs=2)
    assert vectors.words[0] == "cancer"  # most frequent first
    assert sorted(vectors.words) == ["breast", "cancer", "colon", "tumor"]
    assert vectors.vectors.shape == (4, 8) and vectors.vectors.dtype == np.float32


def test_logistic_loss_values():
    x = torch.tensor([2.0, 0.0, -3.0])
    # log(1 + e^-2), log 2, log(1 + e^3)
    assert torch.allclose(logistic(x), torch.tensor([0.126928011, 0.693147181, 3.048587352]), atol=1e-6)


def test_objectives_on_a_hand_computed_batch():
    f_s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    f_pos = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    q_s = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    g_c = torch.tensor([[1.0, 1.0], [0.0, -1.0]])
    swap = (np.array([1, 0]), np.array([True, True]))
    losses = bne_losses(f_s, f_pos, torch.tensor([True, False]), q_s, g_c, {"syn": swap, "def": swap, "ctx": swap})
    # syn: anchor 0: ℓ(2) + ℓ(-0); anchor 1 (no synonym): ℓ(-0)  -> (0.126928 + 2 * 0.693147) / 2
    # def: anchor 0: ℓ(1) + ℓ(-0); anchor 1: ℓ(-2) + ℓ(-2)       -> (0.313262 + 0.693147 + 2 * 2.126928) / 2
    # ctx: anchor 0: ℓ(0) + ℓ(-1); anchor 1: ℓ(2) + ℓ(-2)        -> (0.693147 + 1.313262 + 0.126928 + 2.126928) / 2
    assert losses["syn"].item() == pytest.approx(0.756611, abs=1e-5)
    assert losses["def"].item() == pytest.approx(2.630133, abs=1e-5)
    assert losses["ctx"].item() == pytest.approx(2.130133, abs=1e-5)


def test_negatives_are_other_positions_and_same_concept_ones_are_masked():
    concepts = np.array([3, 3, 5, 7])
    other, valid = draw_negatives(concepts, np.random.default_rng(0))
    assert all(other != np.arange(4))
    assert all(valid == (concepts[other] != concepts))


def test_held_out_split_is_seeded_and_left_out_of_training(sample_kb):
    first, again = held_out_concepts(sample_kb, 20, seed=3), held_out_concepts(sample_kb, 20, seed=3)
    assert first == again and len(first) == 20
    assert held_out_concepts(sample_kb, 20, seed=4) != first
    assert all(len(synonym_sets(sample_kb)[c]) >= 2 for c in first)
    data = SynonymData(synonym_sets(sample_kb, exclude=set(first)))
    assert not set(first) & set(data.concepts)


def test_batches_pair_each_anchor_with_a_synonym_of_its_concept(sample_kb):
    sets = synonym_sets(sample_kb)
    data = SynonymData(sets, seed=0)
    batch = next(data.batches(32))
    for anchor, positive, has_synonym, c in zip(batch.anchors, batch.positives, batch.has_synonym, batch.concepts):
        names = sets[data.concepts[c]]
        assert anchor in names and positive in names
        assert (positive != anchor) == has_synonym == (len(names) > 1)
    assert sum(len(b.anchors) for b in data.batches(32)) == sum(len(v) for v in sets.values())


def test_training_steps_lower_the_loss(sample_kb):
    torch.manual_seed(0)
    config = TrainConfig(**TINY)
    data = SynonymData(synonym_sets(sample_kb), seed=0)
    encoder = build_encoder(random_vectors(sample_kb), data.names, config)
    q = contextual_vectors(encoder, data.names)
    g = concept_vectors(q, data.members)
    batch = next(data.batches(32))
    negatives = {k: draw_negatives(batch.concepts, np.random.default_rng(1)) for k in ("syn", "def", "ctx")}
    inputs = encoder.vocab.batch(batch.anchors + batch.positives)
    idx_n, idx_c = torch.from_numpy(batch.names), torch.from_numpy(batch.concepts)

    def loss() -> torch.Tensor:
        f = encoder.model(inputs)
        losses = bne_losses(f[:32], f[32:], torch.from_numpy(batch.has_synonym), q[idx_n], g[idx_c], negatives)
        return sum(losses.values())

    optimizer = torch.optim.Adam([p for p in encoder.model.parameters() if p.requires_grad], lr=0.01)
    before = loss().item()
    for _ in range(10):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.8 * before
    assert encoder.model.words.weight.grad is None  # the word vectors stay frozen


def test_report_and_dev_selection(sample_kb, monkeypatch):
    import spacy_conceptnorm.training.bne as bne_train

    scores, seen = iter([0.4, 0.9, 0.6]), []  # dev accuracies given by hand: the second epoch is the best

    def scripted_accuracy(mention_vectors, *args):
        seen.append(mention_vectors)  # the dev mentions' vectors after each epoch
        return next(scores)

    monkeypatch.setattr(bne_train, "nearest_name_accuracy", scripted_accuracy)
    config = TrainConfig(epochs=3, pairs_per_epoch=64, holdout=0, **TINY)
    dev = [(name, sample_kb.concepts_for(name)[0]) for name in sample_kb.names()[:10]]
    encoder, report = train_bne(sample_kb, random_vectors(sample_kb), config, dev, log=lambda _: None)
    assert [(r["epoch"], r["dev_acc1"]) for r in report["epochs"]] == [(1, 0.4), (2, 0.9), (3, 0.6)]
    assert all(r["loss_syn"] > 0 for r in report["epochs"])
    assert report["best_epoch"] == 2
    kept = encoder.encode([text for text, _ in dev])  # the weights of epoch 2, not of the last
    assert np.allclose(kept, seen[1], atol=1e-6) and not np.allclose(kept, seen[2], atol=1e-6)


def test_encode_shape_dtype_and_unit_norm(trained, sample_kb):
    encoder, _ = trained
    names = sample_kb.names()[:50] + ["", "an unseen zzzq name"]
    vectors = encoder.encode(names)
    assert vectors.shape == (52, 16) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert encoder.encode([]).shape == (0, 16)


def test_vectors_do_not_depend_on_the_batch(trained, sample_kb):
    encoder, _ = trained
    names = sample_kb.names()[:40]
    together = encoder.encode(names)
    alone = np.stack([encoder.encode([n])[0] for n in names])
    shuffled_order = np.random.default_rng(0).permutation(len(names))
    small = BNEEncoder(encoder.model, encoder.vocab, batch_size=3).encode([names[i] for i in shuffled_order])
    assert np.allclose(together, alone, atol=1e-5)
    assert np.allclose(together[shuffled_order], small, atol=1e-5)


def test_encoding_matches_the_training_forward_pass(trained, sample_kb):
    """`encode` runs its own recurrence (input gates once per symbol); it must equal torch's LSTM in eval mode."""
    encoder, _ = trained
    names = sample_kb.names()[:60] + ["", "x", "a name with a veryveryverylongwordofmorethanthirtytwocharacters"]
    encoder.model.eval()
    with torch.no_grad():
        reference = torch.nn.functional.normalize(encoder.model(encoder.vocab.batch(names)), dim=-1).numpy()
    assert np.allclose(encoder.encode(names), reference, atol=1e-5)


def test_save_load_gives_identical_vectors(trained, sample_kb, tmp_path):
    encoder, report = trained
    encoder.save(tmp_path / "bne", report)
    loaded = BNEEncoder.load(tmp_path / "bne")
    names = sample_kb.names()[:30]
    assert np.array_equal(encoder.encode(names), loaded.encode(names))
    assert json.loads((tmp_path / "bne" / "training.json").read_text())["held_out"] == report["held_out"]
    encoder.save(tmp_path / "bne")  # overwriting an existing directory works
    assert np.array_equal(BNEEncoder.load(tmp_path / "bne").encode(names), loaded.encode(names))


def test_corrupt_or_missing_files_raise_naming_the_file(trained, tmp_path):
    encoder, _ = trained
    encoder.save(tmp_path / "bne")
    weights = tmp_path / "bne" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ConceptNormError, match="model.safetensors"):
        BNEEncoder.load(tmp_path / "bne")
    encoder.save(tmp_path / "bne")
    (tmp_path / "bne" / "config.json").write_text('{"format": "spacy_conceptnorm.bne", "version": 1, "netw')
    with pytest.raises(ConceptNormError, match="config.json"):
        BNEEncoder.load(tmp_path / "bne")
    encoder.save(tmp_path / "bne")
    (tmp_path / "bne" / "config.json").unlink()
    with pytest.raises(ConceptNormError, match="config.json"):
        BNEEncoder.load(tmp_path / "bne")


def test_weights_of_another_network_size_raise(trained, sample_kb, tmp_path):
    encoder, _ = trained
    encoder.save(tmp_path / "a")
    other = build_encoder(random_vectors(sample_kb), sample_kb.names(), TrainConfig(**{**TINY, "word_hidden": 4}))
    other.save(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").write_bytes((tmp_path / "a" / "model.safetensors").read_bytes())
    with pytest.raises(ConceptNormError, match="does not match"):
        BNEEncoder.load(tmp_path / "b")


def test_bad_settings_raise(sample_kb):
    with pytest.raises(ConceptNormError, match="objectives"):
        train_bne(sample_kb, random_vectors(sample_kb), TrainConfig(objectives=["syn", "nope"], **TINY))
    with pytest.raises(ConceptNormError, match="epochs"):
        train_bne(sample_kb, random_vectors(sample_kb), TrainConfig(epochs=0, **TINY))
    single = KnowledgeBase()
    single.add_concept(Concept("D1", "one name only"))
    with pytest.raises(ConceptNormError, match="two or more names"):
        train_bne(single, random_vectors(single), TrainConfig(holdout=0, **TINY))


def test_synonym_closeness_on_a_hand_built_pool():
    # names 0, 1 of concept A; 2, 3 of concept B. Name 0's neighbours by cosine: 2 (0.9), 1 (0.8), 3 (0.1).
    vectors = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.9, 0.0, 0.43589], [0.1, -0.99499, 0.0]])
    labels = [frozenset({"A"}), frozenset({"A"}), frozenset({"B"}), frozenset({"B"})]
    result = synonym_closeness(vectors.astype(np.float32), labels, ks=(1, 2))
    # rankings (cosines): 0 -> 2 .9, 1 .8, 3 .1        synonym 1 at rank 2: AP 1/2, cov@1 0, cov@2 1
    #                     1 -> 0 .8, 2 .72, 3 -.517    synonym 0 at rank 1: AP 1,   cov@1 1, cov@2 1
    #                     2 -> 0 .9, 1 .72, 3 .09      synonym 3 at rank 3: AP 1/3, cov@1 0, cov@2 0
    #                     3 -> 0 .1, 2 .09, 1 -.517    synonym 2 at rank 2: AP 1/2, cov@1 0, cov@2 1
    assert result["queries"] == 4
    assert result["map"] == pytest.approx((0.5 + 1 + 1 / 3 + 0.5) / 4)
    assert result["coverage@1"] == pytest.approx(0.25)
    assert result["coverage@2"] == pytest.approx(0.75)


def test_bm25_retrieves_by_words_and_map_counts_misses_as_zero():
    kb = KnowledgeBase()
    kb.add_concept(Concept("A", "breast cancer"), ["mammary carcinoma"])
    kb.add_concept(Concept("B", "colon cancer"), ["bowel carcinoma"])
    kb.add_concept(Concept("C", "asthma"))
    bm25 = BM25(kb)
    assert bm25.top_concepts("Breast Cancer", k=2) == ["A", "B"]  # "breast" is rarer than "cancer"
    assert bm25.top_concepts("asthma", k=20) == ["C"]  # concepts sharing no word are not candidates
    assert bm25.top_concepts("xyz") == []
    rows = {n: i for i, n in enumerate(bm25.names)}
    names = np.zeros((len(bm25.names), 2), dtype=np.float32)
    names[rows["breast cancer"]] = [1, 0]
    names[rows["colon cancer"]] = [0.8, 0.6]
    names[rows["mammary carcinoma"]] = [0, 1]
    names[rows["bowel carcinoma"]] = [0.6, 0.8]
    query = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    # query 1 ranks: breast cancer (A), colon cancer (B), bowel carcinoma (B), mammary carcinoma (A): AP (1 + 2/4) / 2
    # query 2: gold C was not retrieved: AP 0
    value = synonym_retrieval_map(query, ["A", "C"], [["A", "B"], ["A", "B"]], names, bm25)
    assert value == pytest.approx((0.75 + 0.0) / 2)


def test_nearest_name_accuracy():
    kb = KnowledgeBase()
    kb.add_concept(Concept("A", "alpha"))
    kb.add_concept(Concept("B", "beta"))
    names = kb.names()
    name_vectors = np.eye(2, dtype=np.float32)[[names.index("alpha"), names.index("beta")]]
    queries = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]], dtype=np.float32)
    assert nearest_name_accuracy(queries, ["A", "B", "B"], name_vectors, names, kb) == pytest.approx(2 / 3)


def test_train_bne_command(sample_kb, fixtures, tmp_path):
    random_vectors(sample_kb, dim=200).to_disk(tmp_path / "vectors.txt")
    args = [
        "train-bne", str(fixtures / "medic_sample.txt"), str(tmp_path / "bne"),
        "--vectors", str(tmp_path / "vectors.txt"), "--epochs", "1", "--pairs-per-epoch", "64", "--holdout", "5",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    encoder = BNEEncoder.load(tmp_path / "bne")
    assert encoder.dim == 200 and encoder.encode(["breast cancer"]).shape == (1, 200)
    assert len(json.loads((tmp_path / "bne" / "training.json").read_text())["held_out"]) == 5


def test_registered_encoder_links_in_the_pipeline(trained, sample_kb, tmp_path):
    from spacy.util import registry

    encoder, _ = trained
    encoder.save(tmp_path / "bne")
    assert registry.misc.get("spacy_conceptnorm.bne_encoder.v1")(str(tmp_path / "bne")).dim == 16
    nlp = spacy.blank("en")
    config = {"encoder": {"@misc": "spacy_conceptnorm.bne_encoder.v1", "path": str(tmp_path / "bne")}}
    normalizer = nlp.add_pipe("concept_normalizer", config=config)
    assert isinstance(normalizer.encoder, BNEEncoder)
    normalizer.initialize(nlp=nlp, kb=sample_kb)
    name = sample_kb.names()[5]
    doc = nlp.make_doc(name)
    doc.ents = [Span(doc, 0, len(doc), label="Disease")]
    linked = nlp(doc).ents[0]
    assert linked.kb_id_ in sample_kb.concepts_for(name)  # its own name is the nearest: cosine 1
    # saved with its weights and loaded back as BNE, it links an unseen text as before
    nlp.to_disk(tmp_path / "pipeline")
    reloaded = spacy.load(tmp_path / "pipeline")
    assert isinstance(reloaded.get_pipe("concept_normalizer").encoder, BNEEncoder)
    links = []
    for pipeline in (nlp, reloaded):
        doc = pipeline.make_doc("a text no name spells")
        doc.ents = [Span(doc, 0, len(doc), label="Disease")]
        links.append(pipeline(doc).ents[0]._.kb_ents)
    assert links[0] and links[0] == links[1]


def test_clustering_loads_a_saved_bne_encoder(trained, tmp_path):
    from spacy_conceptnorm.clustering import load_encoder

    encoder, _ = trained
    encoder.save(tmp_path / "bne")
    loaded = load_encoder(str(tmp_path / "bne"))
    assert isinstance(loaded, BNEEncoder)
    texts = ["breast cancer", "ovarian cancer"]
    assert np.array_equal(loaded.encode(texts), encoder.encode(texts))


# --- fast encoding path (bne.inference) ---------------------------------------------------------------------------


def test_fused_recurrence_equals_torchs_lstm_for_both_poolings():
    """`inference.bilstm` (reordered gates, tanh as 2σ(2x) - 1, in-place steps, running max) against nn.LSTM on
    packed sequences of random lengths: last states and max pooling."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from spacy_conceptnorm.ml.bne import inference

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 5, batch_first=True, bidirectional=True).eval()
    table = torch.randn(11, 6)
    lengths = torch.tensor([3, 1, 7, 7, 2, 5])
    ids = torch.randint(0, 11, (6, 7))
    with torch.no_grad():
        packed = pack_padded_sequence(table[ids], lengths, batch_first=True, enforce_sorted=False)
        out, (h_n, _) = lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, padding_value=float("-inf"))
        tables = inference._input_tables(lstm, table)
        last = inference.bilstm(lstm, tables, ids, lengths, pool="last")
        pooled = inference.bilstm(lstm, tables, ids, lengths, pool="max")
    assert torch.allclose(torch.cat(last, dim=-1), torch.cat([h_n[0], h_n[1]], dim=-1), atol=1e-6)
    assert torch.allclose(torch.cat(pooled, dim=-1), out.max(dim=1).values, atol=1e-6)
    with pytest.raises(ValueError, match="pool"):
        inference.bilstm(lstm, tables, ids, lengths, pool="mean")


def test_encoding_in_one_large_batch_equals_small_batches(trained, sample_kb):
    encoder, _ = trained
    names = sample_kb.names()
    assert encoder.batch_size >= len(names)  # the default: every name of the sample in one word-BiLSTM call
    small = BNEEncoder(encoder.model, encoder.vocab, batch_size=7).encode(names)
    assert np.allclose(encoder.encode(names), small, atol=1e-6)


# --- semantic similarity and relatedness (section 4.4) ------------------------------------------------------------


class AngleEncoder:
    """Each term is the 2-d unit vector at a given angle: the cosine of a pair is the cosine of the angle between
    its terms, known by hand."""

    reference = "angles"

    def __init__(self, degrees: dict[str, float]):
        self.degrees = degrees

    def encode(self, texts, progress=False):
        radians = np.radians([self.degrees[t] for t in texts])
        return np.stack([np.cos(radians), np.sin(radians)], axis=1).astype(np.float32)


ANGLES = {"heart attack": 0, "myocardial infarction": 20, "chest pain": 50, "angina": 90, "asthma": 130,
          "fracture, closed": 180}  # fmt: skip
# The UMNSRS layout (Mean, Term1, Term2, CUIs). Angles between the terms, so cosines: 20° (0.94), 50° (0.64),
# 70° (0.34), 80° (0.17), 130° (-0.64), 180° (-1): ranks 6 5 4 3 2 1. The human scores rank 6 4 5 3 1 2, so
# d = 0 1 -1 0 1 -1, sum d² = 4 and rho = 1 - 6 * 4 / (6 * (36 - 1)) = 1 - 24/210 = 31/35.
# Line 8 is blank (ignored); lines 9-11 are bad rows: an empty term, a score that is no number, too few fields.
PAIRS_CSV = """Mean,Term1,Term2,CUI1,CUI2
3.9,heart attack,myocardial infarction,C0027051,C0027051
2.1,heart attack,chest pain,C0027051,C0008031
2.8,myocardial infarction,angina,C0027051,C0002962
1.2,chest pain, asthma ,C0008031,C0004096
0.3,heart attack,asthma,C0027051,C0004096
0.5,heart attack,"fracture, closed",C0027051,C0016658

2.0,,angina,,C0002962
n/a,asthma,angina,C0004096,C0002962
1.5,asthma
"""


def test_similarity_spearman_on_a_hand_written_pair_file(tmp_path):
    from spacy_conceptnorm.evaluation.similarity import pair_cosines, read_term_pairs, similarity_correlation

    (tmp_path / "pairs.csv").write_text(PAIRS_CSV)
    pairs = read_term_pairs(tmp_path / "pairs.csv", term1="term1", term2="term2", score="Mean")  # case ignored
    assert len(pairs) == 6 and pairs.lines == [2, 3, 4, 5, 6, 7]
    assert pairs.term2[3] == "asthma" and pairs.term2[5] == "fracture, closed"  # stripped; quoted comma kept
    assert [line for line, _ in pairs.skipped] == [9, 10, 11]
    assert "empty term1" in pairs.skipped[0][1] and "not a number" in pairs.skipped[1][1]
    assert "2 fields" in pairs.skipped[2][1]
    cosines = pair_cosines(AngleEncoder(ANGLES), pairs.term1, pairs.term2)
    assert np.allclose(cosines, np.cos(np.radians([20, 50, 70, 80, 130, 180])), atol=1e-6)
    result = similarity_correlation(AngleEncoder(ANGLES), pairs)
    assert result["spearman"] == pytest.approx(31 / 35)
    assert result["pairs_used"] == 6 and result["pairs_skipped"] == 3
    assert result["skipped"][0] == {"line": 9, "reason": "empty term1"}
    assert 0 < result["p_value"] < 0.05


def test_similarity_ties_get_average_ranks_and_tabs_are_detected(tmp_path):
    from spacy_conceptnorm.evaluation.similarity import read_term_pairs, similarity_correlation

    # cosines rank 1 2 3 4; the scores tie in the middle: ranks 1 2.5 2.5 4. Pearson of the ranks: deviations
    # (-1.5 -0.5 0.5 1.5) and (-1.5 0 0 1.5), so 4.5 / sqrt(5 * 4.5) = 3 / sqrt(10).
    rows = [("a", "d", 1.0), ("a", "c", 2.0), ("a", "b", 2.0), ("a", "a2", 3.0)]
    text = "x\ty\tsim\n" + "".join(f"{t1}\t{t2}\t{s}\n" for t1, t2, s in rows)
    (tmp_path / "pairs.tsv").write_text(text)
    encoder = AngleEncoder({"a": 0, "a2": 10, "b": 40, "c": 80, "d": 170})
    pairs = read_term_pairs(tmp_path / "pairs.tsv", term1="x", term2="y", score="sim")
    assert similarity_correlation(encoder, pairs)["spearman"] == pytest.approx(3 / np.sqrt(10))
    # all scores equal: no correlation can be measured, reported as NaN
    (tmp_path / "flat.csv").write_text("term1,term2,score\na,b,1\na,c,1\na,d,1\n")
    assert np.isnan(similarity_correlation(encoder, read_term_pairs(tmp_path / "flat.csv"))["spearman"])


def test_similarity_strict_rows_missing_columns_and_too_few_pairs(tmp_path):
    from spacy_conceptnorm.evaluation.similarity import read_term_pairs, similarity_correlation

    (tmp_path / "pairs.csv").write_text(PAIRS_CSV)
    with pytest.raises(ConceptNormError, match=r"pairs\.csv:9: empty term1"):
        read_term_pairs(tmp_path / "pairs.csv", score="Mean", strict=True)
    with pytest.raises(ConceptNormError, match=r"no column 'score' for the score.*'Mean', 'Term1'"):
        read_term_pairs(tmp_path / "pairs.csv")
    with pytest.raises(ConceptNormError, match="Term-pair file not found"):
        read_term_pairs(tmp_path / "missing.csv")
    (tmp_path / "one.csv").write_text("term1,term2,score\nasthma,angina,1\nasthma,,2\n")
    with pytest.raises(ConceptNormError, match=r"1 usable term pairs \(1 rows skipped\)"):
        similarity_correlation(AngleEncoder(ANGLES), read_term_pairs(tmp_path / "one.csv"))
    (tmp_path / "empty.csv").write_text("\n\n")
    with pytest.raises(ConceptNormError, match="0 usable term pairs"):
        read_term_pairs(tmp_path / "empty.csv")


def test_similarity_command_over_several_encoders(tmp_path, monkeypatch):
    import benchmarks.bne as benchmark

    (tmp_path / "pairs.csv").write_text(PAIRS_CSV)
    loaded = []
    monkeypatch.setattr(benchmark, "load_encoder", lambda name: loaded.append(name) or AngleEncoder(ANGLES))
    args = ["similarity", str(tmp_path / "pairs.csv"), "--model", "first", "--model", "second", "--term1", "Term1",
            "--term2", "Term2", "--score", "Mean", "--output", str(tmp_path / "out.json")]  # fmt: skip
    result = CliRunner().invoke(benchmark.app, args)
    assert result.exit_code == 0, result.output
    assert loaded == ["first", "second"]
    assert result.output.count("spearman 0.8857") == 2 and "6 pairs used, 3 skipped" in result.output
    assert "pairs.csv:10: score 'n/a' is not a number" in result.output
    rows = json.loads((tmp_path / "out.json").read_text())
    assert [r["model"] for r in rows] == ["first", "second"] and rows[0]["spearman"] == pytest.approx(31 / 35)
    result = CliRunner().invoke(benchmark.app, [*args[:2], "--score", "Mean", "--strict"])
    assert result.exit_code != 0 and "pairs.csv:9" in str(result.exception)
    loaded.clear()
    assert CliRunner().invoke(benchmark.app, [*args[:2], "--score", "Mean"]).exit_code == 0
    assert loaded == [None]  # no --model: the packaged MiniLM


def test_speed_command_prints_names_per_second_and_the_load(trained, fixtures, tmp_path, monkeypatch):
    import types

    import benchmarks.bne as benchmark

    encoder, _ = trained
    encoder.save(tmp_path / "bne")
    ticks = iter([10.0, 12.0, 20.0, 21.6])  # two timed runs, 2.0 s and 1.6 s: the best, 40 / 1.6 = 25 names/s
    monkeypatch.setattr(benchmark, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    args = ["speed", "--model", str(tmp_path / "bne"), "--kb", str(fixtures / "medic_sample.txt"),
            "--names", "40", "--repeat", "2"]  # fmt: skip
    result = CliRunner().invoke(benchmark.app, args)
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'bne'}: 25 names/s (40 names, best of 2, 1 torch thread(s); load average" in result.output
    assert benchmark.sample_names(list("abcdef"), 0) == list("abcdef")
    sample = benchmark.sample_names(list("abcdef"), 3)
    assert len(set(sample)) == 3 and set(sample) < set("abcdef")
    assert benchmark.sample_names(list("abcdef"), 3) == sample  # seeded


# --- training recipe (configs/bne.cfg) ----------------------------------------------------------------------------


def test_the_recipe_in_configs_is_the_trained_encoders_settings(fixtures):
    from dataclasses import asdict

    from spacy_conceptnorm.training.bne_settings import read_recipe

    recipe = read_recipe(fixtures.parent.parent / "configs" / "bne.cfg")
    assert asdict(recipe.train) == {**asdict(TrainConfig()), "epochs": 6}  # the README's run: paper defaults
    assert recipe.word2vec == {"window": 6, "negative": 5, "min_count": 1, "epochs": 10, "workers": 1}
    assert recipe.threads == 1
    assert read_recipe() == type(recipe)()  # no file: the defaults
    assert read_recipe(None, {"training.epochs": 2}).train.epochs == 2


@pytest.mark.parametrize(
    "text,message",
    [
        ("[training]\nepochs = 0\n", r"\[training\] epochs = 0: Input should be greater than or equal to 1"),
        ("[training]\nepoch = 2\n", r"\[training\] unknown key 'epoch'"),
        ('[training]\nobjectives = ["syn", "nope"]\n', r"objectives.1 = 'nope'"),
        ("[network]\ndropout = 1.0\n", r"\[network\] dropout = 1.0"),
        ("[network]\nout_dim = true\n", r"\[network\] out_dim = True"),
        ('[paths]\nkb = "x"\n', r"unknown section \[paths\]"),
        ("[training\nepochs = 2\n", r"bad\.cfg"),
    ],
)
def test_bad_recipes_name_the_file_section_and_key(tmp_path, text, message):
    from spacy_conceptnorm.training.bne_settings import read_recipe

    (tmp_path / "bad.cfg").write_text(text)
    with pytest.raises(ConceptNormError, match=message):
        read_recipe(tmp_path / "bad.cfg")


def test_train_bne_reads_the_recipe_and_options_override_it(sample_kb, fixtures, tmp_path):
    random_vectors(sample_kb, dim=16).to_disk(tmp_path / "vectors.txt")
    (tmp_path / "tiny.cfg").write_text(
        "[training]\nepochs = 5\npairs_per_epoch = 64\nholdout = 3\nbatch_size = 16\n"
        "[network]\nchar_dim = 8\nchar_hidden = 8\nword_hidden = 12\nout_dim = 16\ndropout = 0.0\n"
    )
    args = ["train-bne", str(fixtures / "medic_sample.txt"), str(tmp_path / "bne"), "--vectors",
            str(tmp_path / "vectors.txt"), "--config", str(tmp_path / "tiny.cfg"), "--epochs", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bne" / "training.json").read_text())
    assert report["config"]["epochs"] == 1 and len(report["epochs"]) == 1  # the option wins
    assert report["config"]["batch_size"] == 16 and len(report["held_out"]) == 3  # the recipe's
    assert BNEEncoder.load(tmp_path / "bne").dim == 16
    result = CliRunner().invoke(app, [*args[:-2], "--epochs", "0"])
    assert result.exit_code != 0 and "[training] epochs = 0" in str(result.exception)
    result = CliRunner().invoke(app, [*args[:5], "--config", str(tmp_path / "missing.cfg")])
    assert result.exit_code != 0 and "missing.cfg" in str(result.exception)


def test_train_bne_recipe_sets_the_skip_gram_vectors(fixtures, tmp_path):
    pytest.importorskip("gensim")
    (tmp_path / "tiny.cfg").write_text(
        "[training]\nepochs = 1\npairs_per_epoch = 32\nholdout = 2\n"
        "[network]\nchar_dim = 8\nchar_hidden = 8\nword_hidden = 8\nout_dim = 8\n"
        "[vectors]\nwindow = 2\nepochs = 1\nmin_count = 2\n"
    )
    args = ["train-bne", str(fixtures / "medic_sample.txt"), str(tmp_path / "bne"), "--config",
            str(tmp_path / "tiny.cfg"), "--save-vectors", str(tmp_path / "v.txt")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bne" / "training.json").read_text())
    assert report["word2vec"] == {"window": 2, "negative": 5, "min_count": 2, "epochs": 1, "workers": 1}
    from collections import Counter

    from spacy_conceptnorm.training.word_vectors import text_sentences

    vectors = WordVectors.from_disk(tmp_path / "v.txt")
    counts = Counter(w for sentence in text_sentences(kb_path=fixtures / "medic_sample.txt") for w in sentence)
    assert vectors.dim == 8 and set(vectors.words) == {w for w, n in counts.items() if n >= 2}  # min_count 2


def test_project_has_a_bne_workflow_outside_all():
    import srsly
    from weasel.util import substitute_project_variables

    from spacy_conceptnorm.training.bne_settings import read_recipe

    root = Path(__file__).parent.parent
    project = substitute_project_variables(srsly.read_yaml(root / "project.yml"))
    assert project["workflows"]["bne"] == ["train-bne"] and "train-bne" not in project["workflows"]["all"]
    command = next(c for c in project["commands"] if c["name"] == "train-bne")
    assert command["outputs"] == ["training/bne"] and "configs/bne.cfg" in command["deps"]
    assert "--config configs/bne.cfg" in command["script"][0]
    read_recipe(root / "configs" / "bne.cfg")
