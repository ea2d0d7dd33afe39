"""The evaluation workflow: gold-mention and end-to-end scores, NIL thresholds and calibration, the report, the CLI.

A fast pipeline: `spacy.blank("en")`, an entity_ruler named "ner", and a concept_normalizer over the MEDIC sample
with the trigram test encoder (built through the registry, so a saved pipeline loads it back)."""

import re

import pytest
import spacy
import srsly
from spacy.tokens import DocBin
from spacy.training import Example
from typer.testing import CliRunner

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.evaluation.calibrate import calibrate, load_pipeline
from spacy_conceptnorm.evaluation.gold import read_gold_docs
from spacy_conceptnorm.evaluation.linking import evaluate_pipeline
from spacy_conceptnorm.evaluation.nil import NilCase, _mean_accuracy, holding_out, nil_accuracy, nil_thresholds
from spacy_conceptnorm.evaluation.report import headline as headline_of
from spacy_conceptnorm.evaluation.report import markdown, write_report
from spacy_conceptnorm.kb.knowledge_base import DOMAIN, Concept, KnowledgeBase, load_kb
from spacy_conceptnorm.linking.linker import Linker
from spacy_conceptnorm.linking.ranker import Ranker
from spacy_conceptnorm.ml.name_encoder import NameEncoder
from spacy_conceptnorm.search.sieve import ALL_STRATEGIES, SieveSearcher

from .fake_encoder import TrigramEncoder


class SavedTrigramEncoder(TrigramEncoder, NameEncoder):
    """The trigram encoder as a NameEncoder whose saved cfg is empty, so `from_disk` keeps the one the config
    built instead of loading a transformer."""

    def config(self):
        return {}


@spacy.registry.misc("test_evaluation.trigram_encoder.v1")
def make_trigram_encoder() -> SavedTrigramEncoder:
    return SavedTrigramEncoder()


PATTERNS = [
    {"label": "Disease", "pattern": [{"LOWER": "breast"}, {"LOWER": "cancer"}]},
    {"label": "Disease", "pattern": [{"LOWER": "ovarian"}, {"LOWER": "cancer"}]},
    {"label": "Chemical", "pattern": [{"LOWER": "liver"}, {"LOWER": "disease"}]},
]
TEXT = "Breast cancer and ovarian cancer run in families with hemochromatosis. Liver disease was rare."
GOLD = [  # ovarian cancer's gold id is deliberately not what the linker finds (D010051)
    ("Breast cancer", "D001943"),
    ("ovarian cancer", "D009369"),
    ("hemochromatosis", "D006432"),
    ("Liver disease", "D008107"),
]


def make_nlp(fixtures, train_docs):
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler", name="ner").add_patterns(PATTERNS)
    encoder = {"@misc": "test_evaluation.trigram_encoder.v1"}
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": encoder})
    normalizer.initialize(
        lambda: [Example(d, d) for d in train_docs], nlp=nlp, kb=load_kb(fixtures / "medic_sample.txt")
    )
    return nlp


@pytest.fixture(scope="module")
def nlp(fixtures, train_docs):
    return make_nlp(fixtures, train_docs)


@pytest.fixture(scope="module")
def saved(nlp, tmp_path_factory):
    path = tmp_path_factory.mktemp("pipelines") / "model"
    nlp.to_disk(path)
    return path


def gold_doc(nlp, text, mentions):
    doc = nlp.make_doc(text)
    doc.ents = [doc.char_span(text.index(m), text.index(m) + len(m), label="Disease", kb_id=cid) for m, cid in mentions]
    return doc


def test_nil_thresholds_follow_dilbert_on_hand_made_scores():
    tp, out = [0.9, 0.8, 0.7], [0.75, 0.6]
    t = nil_thresholds(tp, out)
    assert t["first_fp"] == 0.75 and t["last_tp"] == 0.7
    assert t["weighted"] == pytest.approx(0.73)  # 3/5 of the way from last_tp to first_fp: the TP share
    cases = [NilCase(s, True, True) for s in tp] + [NilCase(0.95, True, False)]
    cases += [NilCase(s, False, False) for s in out]
    # at last_tp every TP is kept, the NIL case at 0.75 is linked: in-KB 3/4, out-of-KB 1/2, overall 4/6
    assert nil_accuracy(cases, t["last_tp"]) == pytest.approx(
        {
            "in_kb_acc": 3 / 4,
            "in_kb_acc_no_nil": 3 / 4,
            "out_of_kb_acc": 1 / 2,
            "overall_acc": 4 / 6,
            "in_kb": 4,
            "out_of_kb": 2,
        }
    )
    # above 0.75 both out-of-KB cases are NIL, and the TP at 0.7 is lost
    assert nil_accuracy(cases, 0.76)["out_of_kb_acc"] == 1.0 and nil_accuracy(cases, 0.76)["in_kb_acc"] == 2 / 4
    with pytest.raises(ConceptNormError, match="out-of-KB"):
        nil_thresholds(tp, [])


def test_in_kb_budget_loses_at_most_the_budget_of_right_links():
    tp = [0.1 * i for i in range(1, 101)]  # 100 right links among 120 in-KB mentions
    t = nil_thresholds(tp, [0.5], in_kb=120, budget=0.025)["in_kb_budget"]
    assert t == pytest.approx(0.4)  # floor(0.025 x 120) = 3 right links (0.1, 0.2, 0.3) fall under it
    cases = [NilCase(s, True, True) for s in tp] + [NilCase(0.99, True, False)] * 20 + [NilCase(0.35, False, False)]
    assert nil_accuracy(cases, t)["in_kb_acc"] == pytest.approx(97 / 120)
    # ties at the cut are kept together: none of three equal lowest scores is lost alone
    assert nil_thresholds([0.2, 0.2, 0.2, 0.9], [0.5], in_kb=100, budget=0.02)["in_kb_budget"] == 0.2


def test_holding_out_hides_a_concept_before_the_sieve_decides():
    kb = KnowledgeBase()
    kb.add_concept(Concept("D015179", "Colorectal Neoplasms"), ["Colorectal Cancer"])
    kb.add_concept(Concept("D009369", "Neoplasms"), ["Cancer", "Tumor"])
    kb.add_concept(Concept("D003920", "Diabetes Mellitus"), ["Diabetes"])
    kb.add_names([("CRC", "D015179")], DOMAIN)
    searcher = SieveSearcher(kb, TrigramEncoder(), strategy="D-T+OD-T", threshold=0.95, top_k=2)
    searcher.build()
    before = searcher.search(["CRC"])[0]
    assert before.candidates[0] == ("D015179", pytest.approx(1.0)) and before.stage == "D-T"
    with holding_out(searcher, {"D015179"}):
        held = searcher.search(["CRC", "Colorectal Cancer"])
    # D-T had only the held-out concept: the query falls through to OD-T, which answers without it
    assert [m.stage for m in held] == ["OD-T", "OD-T"]
    assert all("D015179" not in [c for c, _ in m.candidates] and len(m.candidates) == 2 for m in held)
    assert searcher.search(["CRC"])[0].candidates == before.candidates and searcher.top_k == 2
    # nor is a held-out concept's name a known name in the link's evidence: a real out-of-KB mention is none
    linker = Linker(searcher)
    assert linker.link(["Colorectal Cancer"])[0].evidence["exact"] == 1.0
    with holding_out(searcher, {"D015179"}):
        evidence = linker.link(["Colorectal Cancer"])[0].evidence
    assert evidence["exact"] == 0.0 and evidence["mention_left"] == 0.5  # "colorectal" is not in "Cancer"
    assert linker.link(["Colorectal Cancer"])[0].evidence["exact"] == 1.0


def test_link_evidence_carries_the_answering_concepts_prior_unless_the_mention_is_a_known_name():
    kb = KnowledgeBase()
    kb.add_concept(Concept("D015179", "Colorectal Neoplasms"), ["Colorectal Cancer"])
    kb.add_concept(Concept("D009369", "Neoplasms"), ["Cancer", "Tumor"])
    kb.add_names([("CRC", "D015179"), ("bowel cancer", "D015179")], DOMAIN)
    searcher = SieveSearcher(kb, TrigramEncoder(), strategy="D-T+OD-T", threshold=0.95, top_k=2)
    searcher.build()
    ranker = Ranker()
    ranker.counts = {"D015179": 6}  # six training mentions annotated with it
    crc, colorectal, tumors = Linker(searcher, ranker).link(["CRC", "colorectal cancers", "tumors"])
    assert [m.candidates[0][0] for m in (crc, colorectal, tumors)] == ["D015179", "D015179", "D009369"]
    # D015179: 4 names (2 ontology, 2 domain), 6 annotations; D009369: 3 names, none annotated
    assert colorectal.evidence["names"] == pytest.approx(1.609438)
    assert colorectal.evidence["count_prior"] == pytest.approx(1.945910)
    assert tumors.evidence["names"] == pytest.approx(1.386294) and tumors.evidence["count_prior"] == 0.0
    assert crc.evidence["exact"] == 1.0 and crc.evidence["names"] == crc.evidence["count_prior"] == 0.0
    assert Linker(searcher).link(["colorectal cancers"])[0].evidence["count_prior"] == 0.0  # no ranker's counts
    linker = Linker(searcher)
    linker.link(["colorectal cancers"])
    kb.remove_names([("bowel cancer", "D015179")], DOMAIN)
    linker.changed()
    assert linker.link(["colorectal cancers"])[0].evidence["names"] == pytest.approx(1.386294)  # 3 names now


def test_gold_mentions_refined_set_and_end_to_end_by_hand(nlp):
    test_docs = [gold_doc(nlp, TEXT, GOLD)]
    domain_docs = [gold_doc(nlp, "Familial breast cancer.", [("breast cancer", "D001943")])]
    metrics = evaluate_pipeline(nlp, test_docs, domain_docs)
    gold = metrics["gold_mentions"]
    # gold mentions: all but ovarian cancer are right; the refined set drops "Breast cancer" (a train mention)
    assert (gold["mentions"], gold["refined_mentions"]) == (4, 3)
    assert gold["acc1"] == 3 / 4 and gold["refined_acc1"] == 2 / 3
    assert len(metrics["scores"]["right"]) == 3 and len(metrics["scores"]["wrong"]) == 1
    # end to end: predicted breast cancer (right, linked right), ovarian cancer (right span, wrong id),
    # liver disease (wrong label); hemochromatosis is missed. NER 2 of 3 predicted, 2 of 4 gold.
    e2e = metrics["end_to_end"]
    assert e2e["ner"] == pytest.approx({"p": 2 / 3, "r": 2 / 4, "f": 4 / 7})
    assert e2e["ner_linking"] == pytest.approx({"p": 1 / 3, "r": 1 / 4, "f": 2 / 7})
    # boundary errors compare spans only: liver disease's span is right; hemochromatosis is missed
    assert (e2e["boundaries"]["exact"], e2e["boundaries"]["missed"], e2e["boundaries"]["spurious"]) == (3, 1, 0)
    assert "## Boundary errors (end to end)" in markdown(metrics, headline_of(metrics))
    assert metrics["nil"] is None and metrics["strategies"] == {}
    with nlp.select_pipes(disable=["ner"]):
        assert evaluate_pipeline(nlp, test_docs, domain_docs)["end_to_end"] is None


def test_report_headline_matches_json_and_cli_evaluate(nlp, saved, fixtures, train_docs, test_docs, tmp_path):
    metrics = evaluate_pipeline(nlp, test_docs, train_docs, train_docs, strategies=True)
    assert list(metrics["strategies"]) == ALL_STRATEGIES
    assert metrics["nil"]["dev_held_out_concepts"] > 0 and set(metrics["nil"]["test"]) == {
        "in_kb_budget", "first_fp", "last_tp", "weighted",
    }  # fmt: skip
    assert nlp.get_pipe("concept_normalizer").cfg["strategy"] == "D-T+OD-T"  # restored after the loop
    report = write_report(metrics, tmp_path / "metrics")
    files = {"evaluation.json", "headline.json", "evaluation.png", "report.md"}
    assert {p.name for p in report.parent.iterdir()} == files
    assert (tmp_path / "metrics" / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.read_text()
    table = re.search(r"## Headline\n\n\| metric \| value \|\n\| --- \| --- \|\n((?:\|.*\|\n)+)", text).group(1)
    rows = dict(re.fullmatch(r"\| (.*) \| (.*) \|", line).groups() for line in table.splitlines())
    headline = srsly.read_json(tmp_path / "metrics" / "headline.json")
    # 4 ranking accuracies, 2 as shipped, the ECE, 6 end-to-end; 4 rows per NIL strategy, 2 for in_kb_budget's mean
    assert list(rows) == list(headline) and len(rows) == 13 + 4 * 4 + 2
    nil = metrics["nil"]
    assert nil["test_hold_outs"] == 8 and nil["test_mean"]["last_tp"]["in_kb"] > nil["test"]["last_tp"]["in_kb"]
    assert {k: float(v) for k, v in rows.items()} == headline
    shipped = headline["Acc@1 as shipped (ent.kb_id_, NIL on), gold mentions"]
    assert 0 < shipped <= headline["Acc@1, gold mentions"] <= headline["Acc@5, gold mentions"] <= 100
    assert 0 <= metrics["confidence"]["ece"] <= 1 and "## Calibration of `kb_confidence`" in text
    assert 0 <= headline["NER+linking F1, end to end"] <= headline["NER F1, end to end"] <= 100
    assert 0 < headline["NIL threshold, weighted"] <= 1
    assert all(f"| {s} |" in text for s in ALL_STRATEGIES)

    # the CLI on a saved pipeline, with the test set as a DocBin and train/dev as PubTator files
    DocBin(docs=test_docs, store_user_data=True).to_disk(tmp_path / "test.spacy")
    train = str(fixtures / "ncbi_train_sample.txt")
    args = ["evaluate", str(saved), "--test", str(tmp_path / "test.spacy"), "--train", train, "--dev", train]
    result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "cli"), "--no-strategies"])
    assert result.exit_code == 0, result.output
    cli = srsly.read_json(tmp_path / "cli" / "headline.json")
    assert cli == headline  # same pipeline, same data: same numbers
    assert "## Search strategies" not in (tmp_path / "cli" / "report.md").read_text()


def test_nil_accuracy_over_several_hold_outs_by_hand(tmp_path):
    first = {"in_kb_acc": 0.9, "in_kb_acc_no_nil": 0.95, "out_of_kb_acc": 0.25, "overall_acc": 0.8, "in_kb": 10,
             "out_of_kb": 4}  # fmt: skip
    second = {"in_kb_acc": 0.8, "in_kb_acc_no_nil": 0.85, "out_of_kb_acc": 0.75, "overall_acc": 0.7, "in_kb": 8,
              "out_of_kb": 6}  # fmt: skip
    mean = _mean_accuracy([first, second])
    assert mean == pytest.approx({"in_kb_acc": 0.85, "in_kb_acc_no_nil": 0.9, "out_of_kb_acc": 0.5, "overall_acc": 0.75,
                                  "in_kb": 18, "out_of_kb": 10})  # fmt: skip
    nil = {"thresholds": {"in_kb_budget": 0.6}, "test": {"in_kb_budget": first}, "test_mean": {"in_kb_budget": mean},
           "test_hold_outs": 2, "holdout_fraction": 0.2, "seed": 0}  # fmt: skip
    rows = {k: v for k, v in headline_of({**_by_hand_metrics(), "nil": nil}).items() if k.startswith("NIL")}
    assert rows == {
        "NIL threshold, in_kb_budget": 0.6,
        "NIL in-KB accuracy, in_kb_budget (test; 95.0 with NIL off)": 90.0,
        "NIL out-of-KB accuracy, in_kb_budget (test)": 25.0,
        "NIL overall accuracy, in_kb_budget (test)": 80.0,
        "NIL in-KB accuracy, in_kb_budget (test, mean of 2 hold-outs; 90.0 with NIL off)": 85.0,
        "NIL out-of-KB accuracy, in_kb_budget (test, mean of 2 hold-outs)": 50.0,
    }
    text = write_report({**_by_hand_metrics(), "nil": nil}, tmp_path).read_text()
    assert "\n| in_kb_budget | 0.6000 | test, mean of 2 hold-outs | 85.00 | 50.00 | 75.00 | 18 / 10 |\n" in text


def _by_hand_metrics() -> dict:
    return {
        "pipeline": {"strategy": "D-T+OD-T", "nil_threshold": 0.5},
        "gold_mentions": {
            "mentions": 8,
            "refined_mentions": 3,
            "shipped_acc1": 0.625,
            "shipped_refined_acc1": 1 / 3,
            "acc1": 0.75,
            "acc5": 0.875,
            "refined_acc1": 2 / 3,
            "refined_acc5": 1.0,
        },  # fmt: skip
        "scores": {"right": [0.9, 0.8], "wrong": [0.4]},
    }


def test_headline_and_report_tables_by_hand(tmp_path):
    reliability = [{"low": 0.9, "high": 1.0, "count": 5, "confidence": 0.95, "accuracy": 0.8}]
    nil_test = {"in_kb_acc": 0.9, "in_kb_acc_no_nil": 0.95, "out_of_kb_acc": 0.25, "overall_acc": 0.8125,
                "in_kb": 9, "out_of_kb": 4}  # fmt: skip
    metrics = {
        **_by_hand_metrics(),
        "confidence": {"ece": 0.02934, "reliability": reliability},
        "end_to_end": {
            "ner": {"p": 2 / 3, "r": 1 / 2, "f": 4 / 7},
            "ner_linking": {"p": 1 / 3, "r": 1 / 4, "f": 2 / 7},
        },
        "nil": {"thresholds": {"last_tp": 0.712345}, "test": {"last_tp": nil_test}, "holdout_fraction": 0.1, "seed": 0},
    }
    assert headline_of(metrics) == {
        "Acc@1 as shipped (ent.kb_id_, NIL on), gold mentions": 62.5,
        "Acc@1 as shipped, refined gold mentions": 33.33,
        "Acc@1, gold mentions": 75.0,
        "Acc@5, gold mentions": 87.5,
        "Acc@1, refined gold mentions": 66.67,
        "Acc@5, refined gold mentions": 100.0,
        "Expected calibration error of kb_confidence (%)": 2.93,
        "NER precision, end to end": 66.67,
        "NER recall, end to end": 50.0,
        "NER F1, end to end": 57.14,
        "NER+linking precision, end to end": 33.33,
        "NER+linking recall, end to end": 25.0,
        "NER+linking F1, end to end": 28.57,
        "NIL threshold, last_tp": 0.7123,
        "NIL in-KB accuracy, last_tp (test; 95.0 with NIL off)": 90.0,
        "NIL out-of-KB accuracy, last_tp (test)": 25.0,
        "NIL overall accuracy, last_tp (test)": 81.25,
    }
    text = write_report(metrics, tmp_path).read_text()
    for line in [
        "| metric | value |",
        "| NER F1, end to end | 57.14 |",
        "| NIL threshold, last_tp | 0.7123 |",
        "Expected calibration error 2.93% (10 equal-width bins; right = top candidate right).",
        "| 0.9-1.0 | 5 | 0.950 | 0.800 |",
        "| last_tp | 0.7123 | test | 90.00 | 25.00 | 81.25 | 9 / 4 |",
    ]:
        assert f"\n{line}\n" in text, line
    assert "## Search strategies" not in text and "not computed" not in text


def test_calibrate_writes_nil_threshold_into_the_saved_pipeline(nlp, saved, fixtures, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(saved, model)
    dev = str(fixtures / "ncbi_test_sample.txt")  # mentions that are not domain synonyms of the pipeline
    figures = calibrate(model, dev, strategy="last_tp")
    last_tp, stored = figures["thresholds"]["last_tp"], figures["nil_threshold"]
    assert 0.0 < last_tp - 2e-6 < stored < last_tp  # rounded down: the defining mention stays linked
    loaded = spacy.load(model)
    from_cfg = loaded.get_pipe("concept_normalizer").cfg["nil_threshold"]
    assert from_cfg == pytest.approx(stored, abs=1e-12) and from_cfg < last_tp
    assert loaded.config["components"]["concept_normalizer"]["nil_threshold"] == pytest.approx(stored, abs=1e-12)
    config = spacy.util.load_config(model / "config.cfg")
    assert config["components"]["concept_normalizer"]["nil_threshold"] == pytest.approx(stored, abs=1e-12)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary directory left
    # the CLI, default strategy: the in-KB budget threshold replaces the last one
    result = CliRunner().invoke(app, ["calibrate", str(model), "--dev", dev])
    assert result.exit_code == 0, result.output
    budget = spacy.load(model).get_pipe("concept_normalizer").cfg["nil_threshold"]
    assert budget == pytest.approx(figures["thresholds"]["in_kb_budget"], abs=1e-6)
    assert figures["thresholds"]["in_kb_budget"] >= figures["thresholds"]["last_tp"]  # never below every right link


def test_calibrate_tunes_the_sieve_on_dev_without_dev_mentions_as_domain_names(saved, fixtures, tmp_path):
    dev = fixtures / "ncbi_train_sample.txt"  # the pipeline's own domain synonyms: the leak to avoid
    before = spacy.load(saved).get_pipe("concept_normalizer")
    domain_before = sorted(before.kb.names(DOMAIN))
    out = tmp_path / "calibrated"
    figures = calibrate(saved, dev, output_model=out)
    assert figures["hidden_dev_names"] > 0  # each dev mention would otherwise find itself at cosine 1
    sieve = figures["sieve"]
    assert sieve["threshold"] in (0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0)
    assert sieve["dev_acc1"][str(sieve["threshold"])] == max(sieve["dev_acc1"].values())
    loaded = spacy.load(out)
    normalizer = loaded.get_pipe("concept_normalizer")
    assert normalizer.cfg["threshold"] == sieve["threshold"] == normalizer.searcher.threshold
    assert loaded.config["components"]["concept_normalizer"]["threshold"] == sieve["threshold"]
    assert sorted(normalizer.kb.names(DOMAIN)) == domain_before  # the hidden names are back
    assert spacy.load(saved).get_pipe("concept_normalizer").cfg["nil_threshold"] == 0.0  # --to: source unchanged
    # dev mentions that are train mentions too stay: nothing is hidden when dev is the train data
    assert calibrate(saved, dev, train=dev, tune_sieve=False, output_model=out)["hidden_dev_names"] == 0
    assert spacy.load(out).get_pipe("concept_normalizer").cfg["threshold"] == 0.95  # not tuned: as configured


def test_bad_input_raises_clear_errors(nlp, saved, fixtures, tmp_path):
    train = fixtures / "ncbi_train_sample.txt"
    with pytest.raises(ConceptNormError, match="Gold data not found: .*missing.spacy"):
        read_gold_docs(nlp, tmp_path / "missing.spacy")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConceptNormError, match="empty.txt holds no gold entity"):
        read_gold_docs(nlp, tmp_path / "empty.txt")
    with pytest.raises(ConceptNormError, match="test_docs holds no gold entity"):
        evaluate_pipeline(nlp, [], [])
    with pytest.raises(ConceptNormError, match="Pipeline directory not found: .*nowhere"):
        calibrate(tmp_path / "nowhere", train)
    with pytest.raises(ConceptNormError, match="Unknown NIL threshold strategy 'median'"):
        calibrate(saved, train, strategy="median")
    spacy.blank("en").to_disk(tmp_path / "blank")
    with pytest.raises(ConceptNormError, match="blank has no concept_normalizer"):
        load_pipeline(tmp_path / "blank")
    with pytest.raises(ConceptNormError, match="no concept_normalizer"):
        evaluate_pipeline(spacy.blank("en"), [], [])
    with pytest.raises(ConceptNormError, match="holdout must be a fraction"):
        evaluate_pipeline(nlp, read_gold_docs(nlp, train), [], read_gold_docs(nlp, train), holdout=1.5)
