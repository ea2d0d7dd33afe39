"""Term clustering (CODER++ 3.1), its O(n) pairwise evaluation (3.2), the threshold sweep and the `cluster` CLI."""

import itertools
import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

import spacy_conceptnorm.clustering as clustering
from spacy_conceptnorm.annotate import jsonl_record
from spacy_conceptnorm.cli import app
from spacy_conceptnorm.clustering import (
    DEFAULT_THRESHOLDS,
    cluster_terms,
    count_brute_force,
    count_clusters,
    count_pairs,
    kb_terms,
    neighbour_graph,
    read_nil_mentions,
    sweep,
    term_graph,
)
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import load_kb

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

runner = CliRunner()


class TableEncoder:
    """Fixed vectors per text (normalized), so neighbours and cosines are known by hand."""

    reference = "table-encoder"

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table
        self.calls: list[list[str]] = []

    def encode(self, texts, progress=False):
        self.calls.append(list(texts))
        out = np.array([self.table[t] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def at_angle(degrees: float) -> np.ndarray:
    return np.array([np.cos(np.radians(degrees)), np.sin(np.radians(degrees))])


# a 0°, b 10°, c 25°, d 90°, e 100°: cos(a,b) = cos(d,e) = .985, cos(b,c) = .966, cos(a,c) = .906, others < .5
ANGLES = {"a": 0, "b": 10, "c": 25, "d": 90, "e": 100}
TERMS = list(ANGLES)
GOLD = ["C1", "C1", "C2", "C3", "C3"]


@pytest.fixture
def table():
    return TableEncoder({t: at_angle(a) for t, a in ANGLES.items()})


def pair_set(graph, threshold):
    rows, cols = graph.pairs(threshold)
    return {(TERMS[i], TERMS[j]) for i, j in zip(rows.tolist(), cols.tolist())}


# --- clustering ---------------------------------------------------------------------------------------------------
def test_hand_made_clusters(table):
    assert cluster_terms(TERMS, table, top_m=1, threshold=0.95).tolist() == [0, 0, 0, 1, 1]  # a-b-c chained
    assert cluster_terms(TERMS, table, top_m=1, threshold=0.97).tolist() == [0, 0, 1, 2, 2]  # b-c (.966) cut
    assert cluster_terms(TERMS, table, top_m=4, threshold=0.99).tolist() == [0, 1, 2, 3, 4]
    assert cluster_terms(TERMS, table, top_m=4, threshold=-1.0).tolist() == [0, 0, 0, 0, 0]


def test_top_m_limits_the_pairs(table):
    vectors = np.array([at_angle(ANGLES[t]) for t in TERMS], dtype=np.float32)
    one = neighbour_graph(vectors, top_m=1, min_score=0.9)
    two = neighbour_graph(vectors, top_m=2, min_score=0.9)
    # a's nearest is b, c's nearest is b: a-c (.906) is in no term's top-1, but in a's top-2
    assert pair_set(one, 0.9) == {("a", "b"), ("b", "c"), ("d", "e")}
    assert pair_set(two, 0.9) == {("a", "b"), ("b", "c"), ("a", "c"), ("d", "e")}
    assert pair_set(two, 0.95) == {("a", "b"), ("b", "c"), ("d", "e")}
    assert one.scores.tolist() == sorted(one.scores.tolist(), reverse=True)


def test_threshold_is_inclusive():
    vectors = np.array([[1.0, 0.0], [0.75, np.sqrt(1 - 0.75**2)], [0.0, 1.0]], dtype=np.float32)  # cos(0, 1) = .75
    graph = neighbour_graph(vectors, top_m=2, min_score=0.5)
    assert graph.clusters(0.75).tolist() == [0, 0, 1]
    assert graph.clusters(0.7500001).tolist() == [0, 1, 2]


def test_duplicates_are_encoded_once_and_share_a_cluster(table):
    labels = cluster_terms(["c", "a", "c", "d", "a"], table, top_m=2, threshold=0.99)
    assert labels.tolist() == [0, 1, 0, 2, 1]  # numbered by first appearance
    assert sorted(table.calls[0]) == ["a", "c", "d"]


def test_search_matches_the_definition():
    """Pairs (i, j) with j in i's top-m or i in j's, cosine >= θ: against a full similarity matrix."""
    rng = np.random.default_rng(3)
    for n, m, theta in [(30, 3, 0.0), (60, 5, 0.2), (7, 10, -1.0), (300, 4, 0.3)]:
        vectors = rng.normal(size=(n, 8)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        sims = vectors @ vectors.T
        expected = set()
        for i in range(n):
            others = [j for j in np.argsort(-sims[i]) if j != i][:m]
            expected |= {(min(i, j), max(i, j)) for j in others if sims[i, j] >= theta}
        graph = neighbour_graph(vectors, top_m=m, min_score=theta)
        assert set(zip(graph.rows.tolist(), graph.cols.tolist())) == expected
        ivf = neighbour_graph(vectors, top_m=m, min_score=theta, index_type="ivf", nprobe=64)
        assert ivf.index_type == "ivf" and set(zip(ivf.rows.tolist(), ivf.cols.tolist())) == expected


def test_empty_and_single_inputs(table):
    assert cluster_terms([], table).tolist() == []
    assert cluster_terms(["a"], table).tolist() == [0]
    assert count_clusters([], []).tp == 0


@pytest.mark.parametrize("kwargs, fragment", [
    ({"threshold": 1.5}, "threshold must be a cosine in [-1, 1], got 1.5"),
    ({"threshold": float("nan")}, "threshold must be a cosine"),
    ({"top_m": 0}, "top_m must be a positive integer"),
    ({"top_m": 2.5}, "top_m must be a positive integer"),
])  # fmt: skip
def test_bad_arguments(table, kwargs, fragment):
    with pytest.raises(ConceptNormError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        cluster_terms(TERMS, table, **kwargs)


# --- evaluation ---------------------------------------------------------------------------------------------------
def brute_force(n, together, gold):
    """Every pair looked at, in plain Python."""
    tp = fp = fn = tn = 0
    for i, j in itertools.combinations(range(n), 2):
        same, predicted = gold[i] == gold[j], together(i, j)
        tp += same and predicted
        fp += predicted and not same
        fn += same and not predicted
        tn += not same and not predicted
    return tp, fp, fn, tn


def as_tuple(counts):
    return counts.tp, counts.fp, counts.fn, counts.tn


def test_hand_made_evaluation(table):
    graph = term_graph(TERMS, table, top_m=1, min_score=0.95)
    # predicted pairs a-b, b-c, d-e; gold pairs a-b, d-e; 10 pairs in all
    assert as_tuple(count_pairs(*graph.pairs(0.95), GOLD)) == (2, 1, 0, 7)
    # components {a, b, c}, {d, e}: a-c is predicted too
    assert as_tuple(count_clusters(graph.clusters(0.95), GOLD)) == (2, 2, 0, 6)
    assert as_tuple(count_clusters([-1, -1, -1, 10**12, 10**12], GOLD)) == (2, 2, 0, 6)  # any label values
    scores = count_pairs(*graph.pairs(0.95), GOLD)
    assert (scores.precision, scores.recall) == (2 / 3, 1.0) and scores.f1 == pytest.approx(0.8)


def test_linear_counts_equal_brute_force_on_random_cases():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 25)
        gold = [rng.choice("ABCDEFG"[: rng.randint(1, 7)]) for _ in range(n)]
        all_pairs = list(itertools.combinations(range(n), 2))
        pairs = set(rng.sample(all_pairs, rng.randint(0, len(all_pairs))))
        rows, cols = np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)
        assert as_tuple(count_pairs(rows, cols, gold)) == brute_force(
            n, lambda i, j, pairs=pairs: (i, j) in pairs, gold
        )
        labels = [rng.randint(0, max(1, n // 3)) for _ in range(n)]
        expected = brute_force(n, lambda i, j, labels=labels: labels[i] == labels[j], gold)
        assert as_tuple(count_clusters(labels, gold)) == expected
        if n:
            matrix = np.array(labels)
            vectorized = count_brute_force(lambda r, c, m=matrix: m[r][:, None] == m[c][None, :], gold, block=4)
            assert as_tuple(vectorized) == expected


def test_gold_must_match_the_terms():
    with pytest.raises(ConceptNormError, match="3 labels for 2 terms"):
        count_clusters([0, 1], ["A", "B", "C"])


# --- sweep --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample():
    terms = kb_terms(load_kb(FIXTURES / "medic_sample.txt"))
    encoder = TrigramEncoder()
    graph = term_graph(terms.texts, encoder, top_m=10, min_score=min(DEFAULT_THRESHOLDS))
    return terms, graph, encoder


def test_sweep_is_monotonic(sample):
    terms, graph, encoder = sample
    rows = sweep(graph, DEFAULT_THRESHOLDS, terms.gold)
    n = len(terms.texts)
    assert len(encoder.calls) == 1 and [r["threshold"] for r in rows] == sorted(DEFAULT_THRESHOLDS)
    for low, high in zip(rows, rows[1:]):
        assert high["predicted_pairs"] <= low["predicted_pairs"]
        assert high["clusters"] >= low["clusters"]  # components only split as θ rises
        for reading in ("pairs", "clusters_eval"):
            assert high[reading]["tp"] <= low[reading]["tp"]
            assert high[reading]["tp"] + high[reading]["fp"] <= low[reading]["tp"] + low[reading]["fp"]
            assert high[reading]["recall"] <= low[reading]["recall"]
            assert high[reading]["fn"] >= low[reading]["fn"]
    for row in rows:
        for reading in ("pairs", "clusters_eval"):
            assert sum(row[reading][k] for k in ("tp", "fp", "fn", "tn")) == n * (n - 1) // 2
        # components hold their pairs and more
        assert row["clusters_eval"]["tp"] >= row["pairs"]["tp"]
        assert row["clusters_eval"]["tp"] + row["clusters_eval"]["fp"] >= row["predicted_pairs"]
    assert rows[-1]["predicted_pairs"] < rows[0]["predicted_pairs"]  # the sweep does move


def test_sweep_rows_equal_a_fresh_search_at_each_threshold(sample):
    terms, graph, _ = sample
    rows = {r["threshold"]: r for r in sweep(graph, DEFAULT_THRESHOLDS, terms.gold)}
    for theta in (0.4, 0.6, 0.9):
        fresh = term_graph(terms.texts, TrigramEncoder(), top_m=10, min_score=theta)
        assert rows[theta]["predicted_pairs"] == len(fresh.rows)
        assert rows[theta]["pairs"] == count_pairs(fresh.rows, fresh.cols, terms.gold).as_dict()
        assert rows[theta]["clusters_eval"] == count_clusters(fresh.clusters(theta), terms.gold).as_dict()


def test_kb_terms_ambiguous_names(kb):
    before = kb_terms(kb)
    assert "liver disease" in before.texts
    kb.add_names([("liver disease", "D005359")], source="ontology")  # now a name of two concepts
    dropped, first = kb_terms(kb), kb_terms(kb, ambiguous="first")
    assert "liver disease" not in dropped.texts and dropped.dropped == before.dropped + 1
    assert len(first.texts) == len(before.texts) + before.dropped
    assert first.gold[first.texts.index("liver disease")] == "D008107"
    with pytest.raises(ConceptNormError, match="choose one of"):
        kb_terms(kb, ambiguous="all")


# --- CLI ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_encoder(monkeypatch):
    monkeypatch.setattr(clustering, "load_encoder", lambda model=None: TrigramEncoder())


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_term_list(tmp_path, fake_encoder):
    terms = tmp_path / "terms.txt"
    terms.write_text("heart attack\nheart attacks\nasthma\n\nheart attack\nasthmatic\n")
    out = tmp_path / "out" / "clusters.jsonl"
    result = runner.invoke(app, ["cluster", str(terms), str(out), "--top-m", "3", "--threshold", "0.8"])
    assert result.exit_code == 0, result.output
    assert "4 terms -> 3 clusters" in result.output
    records = read_jsonl(out)
    assert records[0] == {
        "cluster": 0, "name": "heart attack", "size": 2, "count": 3,
        "members": [{"text": "heart attack", "count": 2}, {"text": "heart attacks", "count": 1}],
    }  # fmt: skip
    assert sorted(r["name"] for r in records[1:]) == ["asthma", "asthmatic"]  # cosine .76 < .8
    assert not list(out.parent.glob(".*tmp"))


def test_cli_kb_with_sweep(tmp_path, fake_encoder):
    out = tmp_path / "medic.jsonl"
    args = ["cluster", str(FIXTURES / "medic_sample.txt"), str(out), "--top-m", "5", "--threshold", "0.7", "--sweep"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pairs: P " in result.output and "clusters_eval: P " in result.output
    records = read_jsonl(out)
    assert sum(r["size"] for r in records) == len(kb_terms(load_kb(FIXTURES / "medic_sample.txt")).texts)
    assert all("concept_id" in m for r in records for m in r["members"])
    report = json.loads(out.with_suffix(".sweep.json").read_text())
    assert {r["threshold"] for r in report["thresholds"]} == set(DEFAULT_THRESHOLDS)
    assert report["best"]["pairs"]["pairs"]["f1"] == max(r["pairs"]["f1"] for r in report["thresholds"])
    assert out.with_suffix(".sweep.png").read_bytes()[:4] == b"\x89PNG"


def annotate_output(path):
    """An `annotate` JSONL output, written with its own record writer."""

    def entity(text, concept_id, parts=None):
        record = {"start": 0, "end": len(text), "text": text, "label": "Disease", "concept_id": concept_id,
                  "score": 0.5, "confidence": 0.1, "name": None, "stage": "1"}  # fmt: skip
        if parts:
            record["parts"] = [{"text": t, "concept_id": c, "score": 0.5, "confidence": 0.1, "name": None,
                                "stage": "1"} for t, c in parts]  # fmt: skip
        return record

    documents = [
        ("d1", [entity("Foo-Syndrome", "NIL"), entity("diabetes", "D003920")]),
        ("d2", [entity("foo syndrome", None), entity("Foo syndromes", "NIL")]),
        (
            "d3",
            [
                entity(
                    "qux deficiency and diabetes", "NIL|D003920", [("qux deficiency", "NIL"), ("diabetes", "D003920")]
                )
            ],
        ),  # fmt: skip
        ("d4", []),
        ("d5", [entity("qux deficiencies", "NIL"), entity("bar disease", "NIL"), entity("foo syndrome", "NIL")]),
    ]
    path.write_text("".join(jsonl_record(doc_id, "", ents, False) for doc_id, ents in documents))
    return path


def test_nil_mentions(tmp_path):
    terms = read_nil_mentions(annotate_output(tmp_path / "annotated.jsonl"))
    found = {
        t: (c, dict(s), sorted(d)) for t, c, s, d in zip(terms.texts, terms.counts, terms.surfaces, terms.documents)
    }
    assert found == {
        "foo syndrome": (3, {"Foo-Syndrome": 1, "foo syndrome": 2}, ["d1", "d2", "d5"]),
        "foo syndromes": (1, {"Foo syndromes": 1}, ["d2"]),
        "qux deficiency": (1, {"qux deficiency": 1}, ["d3"]),
        "qux deficiencies": (1, {"qux deficiencies": 1}, ["d5"]),
        "bar disease": (1, {"bar disease": 1}, ["d5"]),
    }


def test_cli_nil_mentions_propose_concepts(tmp_path, fake_encoder):
    out = tmp_path / "new_concepts.jsonl"
    source = annotate_output(tmp_path / "annotated.jsonl")
    result = runner.invoke(app, ["cluster", str(source), str(out), "--threshold", "0.8"])
    assert result.exit_code == 0, result.output
    records = read_jsonl(out)
    assert [(r["name"], r["size"], r["count"], r["documents"]) for r in records] == [
        ("foo syndrome", 2, 4, 3),
        ("qux deficiencies", 2, 2, 2),  # tie on count: surface forms by text
        ("bar disease", 1, 1, 1),
    ]
    assert records[0]["members"] == [
        {"text": "foo syndrome", "count": 2},
        {"text": "Foo syndromes", "count": 1},
        {"text": "Foo-Syndrome", "count": 1},
    ]


@pytest.mark.parametrize("content, args, fragment", [
    ("", [], "empty.txt holds no line: nothing to cluster"),
    ("\n  \n", ["--input-format", "terms"], "empty.txt holds no term"),
    ("heart attack\n", ["--threshold", "1.5"], "threshold must be a cosine in [-1, 1], got 1.5"),
    ("heart attack\n", ["--threshold", "-2"], "got -2.0"),
    ("heart attack\n", ["--top-m", "0"], "top_m must be a positive integer"),
    ("heart attack\n", ["--input-format", "csv"], "Unknown clustering input format 'csv'"),
])  # fmt: skip
def test_cli_bad_input(tmp_path, fake_encoder, content, args, fragment):
    terms = tmp_path / "empty.txt"
    terms.write_text(content)
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["cluster", str(terms), str(out), *args])
    assert result.exit_code == 1
    assert fragment in " ".join(result.output.split())
    assert not out.exists()


def test_cli_malformed_annotate_line(tmp_path, fake_encoder):
    source = tmp_path / "annotated.jsonl"
    source.write_text('{"id": "d1", "entities": []}\n{"id": "d2", "entities": [\n')
    result = runner.invoke(app, ["cluster", str(source), str(tmp_path / "out.jsonl")])
    assert result.exit_code == 1
    assert f"{source}:2: not an `annotate` JSONL record" in " ".join(result.output.split())
    source.write_text('{"id": "d1", "entities": {"text": "x"}}\n')
    result = runner.invoke(app, ["cluster", str(source), str(tmp_path / "out.jsonl"), "--input-format", "annotate"])
    assert result.exit_code == 1 and ":1: " in result.output and "'entities' is not a list" in result.output
