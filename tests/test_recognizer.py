"""The recognizer's helpers: boundary-error categories, the dictionary_matcher and the link_filter components."""

import itertools
import zlib

import numpy as np
import pytest
import spacy
import srsly
from spacy.tokens import Doc, Span
from spacy.training import Example
from transformers import AutoConfig

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.evaluation.boundaries import boundary_errors
from spacy_conceptnorm.pipeline.dictionary_matcher import DictionaryMatcher
from spacy_conceptnorm.pipeline.link_filter import LinkFilter

if not Span.has_extension("kb_confidence"):
    Span.set_extension("kb_confidence", default=None)

TEXT = (
    "Women with hereditary breast cancer and familial polyposis carry mutations ; breast and ovarian cancer "
    "families and anemia patients , ataxia - telangiectasia and diabetes were seen ."
)


@pytest.fixture
def nlp():
    return spacy.blank("en")


def doc_with(nlp, ents: list[str]) -> Doc:
    """A doc of TEXT with entities given by their text (each found once, left to right)."""
    doc = nlp.make_doc(TEXT)
    spans, start = [], 0
    for text in ents:
        begin = TEXT.index(text, start)
        spans.append(doc.char_span(begin, begin + len(text), label="Disease"))
        start = begin + len(text)
    doc.ents = spans
    return doc


def test_boundary_categories(nlp):
    gold = doc_with(
        nlp,
        [
            "hereditary breast cancer",  # found without "hereditary": missing_words
            "polyposis",  # found as "familial polyposis": extra_words
            "breast and ovarian cancer",  # found as "ovarian cancer": coordination
            "anemia",  # not found: missed
            "ataxia - telangiectasia",  # found right: exact
            "diabetes",  # found as "diabetes were": extra_words
        ],
    )
    pred = doc_with(
        nlp,
        [
            "breast cancer",
            "familial polyposis",
            "mutations",
            "ovarian cancer",
            "ataxia - telangiectasia",
            "diabetes were",
        ],
    )
    counts = boundary_errors([(gold, pred)])
    assert counts["exact"] == 1
    assert counts["missing_words"] == 1
    assert counts["extra_words"] == 2  # "familial polyposis" and "diabetes were"
    assert counts["coordination"] == 1
    assert counts["missed"] == 1
    assert counts["spurious"] == 1  # "mutations"
    assert counts["crossing"] == 0
    assert dict(map(tuple, counts["words"]["missing"])) == {"hereditary": 1}
    assert dict(map(tuple, counts["words"]["extra"])) == {"familial": 1, "were": 1}


def test_boundary_crossing_and_two_golds_merged(nlp):
    gold = doc_with(nlp, ["hereditary breast", "familial polyposis"])
    pred = doc_with(nlp, ["breast cancer and familial"])
    counts = boundary_errors([(gold, pred)])
    # one group: the prediction crosses both gold entities, and the words that differ hold "and"
    assert counts["coordination"] == 1
    assert sum(counts[k] for k in ("exact", "spurious", "missed", "extra_words", "missing_words", "crossing")) == 0
    gold = doc_with(nlp, ["hereditary breast"])
    pred = doc_with(nlp, ["breast cancer"])
    assert boundary_errors([(gold, pred)])["crossing"] == 1


def test_boundary_empty_docs(nlp):
    counts = boundary_errors([(nlp.make_doc("no entity here"), nlp.make_doc("no entity here"))])
    assert all(counts[k] == 0 for k in counts if k != "words")


def make_matcher(nlp, names, train_docs=(), **cfg) -> DictionaryMatcher:
    matcher = nlp.add_pipe("dictionary_matcher", config=cfg)
    matcher.initialize(lambda: [Example(nlp.make_doc(d.text), d) for d in train_docs], nlp=nlp, names=names)
    return matcher


def test_dictionary_adds_matches_case_insensitively(nlp):
    make_matcher(nlp, ["Breast Cancer", "ovarian cancer", "x"])
    doc = nlp("Breast and ovarian cancer ; BREAST CANCER ; x")
    assert [(e.text, e.label_) for e in doc.ents] == [("ovarian cancer", "Disease"), ("BREAST CANCER", "Disease")]


def test_dictionary_merge_rules(nlp):
    doc = nlp.make_doc("familial breast cancer and anemia")
    doc.ents = [Span(doc, 0, 2, label="Disease")]  # "familial breast" from the recognizer
    longest = DictionaryMatcher(nlp.vocab, merge="longest")
    longest.set_names(["breast cancer", "anemia"])
    assert [e.text for e in longest(doc).ents] == ["familial breast", "anemia"]  # a tie: the entity stays
    doc.ents = [Span(doc, 1, 2, label="Disease")]  # "breast"
    assert [e.text for e in longest(doc).ents] == ["breast cancer", "anemia"]
    doc.ents = [Span(doc, 1, 2, label="Disease")]
    fill = DictionaryMatcher(nlp.vocab, merge="fill")
    fill.set_names(["breast cancer", "anemia"])
    assert [e.text for e in fill(doc).ents] == ["breast", "anemia"]


def test_dictionary_records_the_entities_it_added(nlp):
    doc = nlp.make_doc("familial breast cancer and anemia")
    matcher = DictionaryMatcher(nlp.vocab)
    matcher.set_names(["breast cancer", "anemia"])
    doc.ents = [Span(doc, 1, 2, label="Disease")]  # "breast": the longer match takes its place
    assert [e.text for e in matcher(doc).spans["dictionary"]] == ["breast cancer", "anemia"]
    doc.ents = [Span(doc, 1, 3, label="Disease")]  # "breast cancer" from the recognizer too: its entity
    assert [e.text for e in matcher(doc).ents] == ["breast cancer", "anemia"]
    assert [e.text for e in doc.spans["dictionary"]] == ["anemia"]
    unrecorded = DictionaryMatcher(nlp.vocab, spans_key=None)
    unrecorded.set_names(["anemia"])
    plain = unrecorded(nlp.make_doc("anemia"))
    assert [e.text for e in plain.ents] == ["anemia"] and "dictionary" not in plain.spans
    found_nothing = matcher(nlp.make_doc("fever"))
    assert "dictionary" in found_nothing.spans and len(found_nothing.spans["dictionary"]) == 0


def test_dictionary_keeps_names_precise_on_training_docs(nlp):
    train = nlp.make_doc("The disease anemia . Another disease . Cancer and anemia .")
    train.ents = [Span(train, 2, 3, label="Disease"), Span(train, 9, 10, label="Disease")]  # both "anemia"
    matcher = make_matcher(nlp, ["disease", "anemia", "leukemia"], [train], min_precision=0.5)
    assert matcher.names == ["anemia", "leukemia"]  # "disease": 0 of 2 matches are entities; leukemia unseen
    unseen_off = DictionaryMatcher(nlp.vocab, min_precision=0.5, keep_unseen=False)
    unseen_off.initialize(lambda: [Example(nlp.make_doc(train.text), train)], names=["disease", "leukemia"])
    assert unseen_off.names == ["anemia"]  # the training mention is a name too


def test_dictionary_reads_kb_names(nlp, kb):
    matcher = make_matcher(nlp, [])
    matcher.initialize(lambda: [], kb=kb)
    doc = nlp("Mutations cause ovarian neoplasms and liver disease .")
    assert [e.text for e in doc.ents] == ["ovarian neoplasms", "liver disease"]


def test_dictionary_round_trip(nlp, tmp_path):
    make_matcher(nlp, ["anemia", "liver disease"], merge="fill")
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert loaded.get_pipe("dictionary_matcher").names == ["anemia", "liver disease"]
    assert loaded.get_pipe("dictionary_matcher").cfg["merge"] == "fill"
    assert [e.text for e in loaded("Liver disease , anemia").ents] == ["Liver disease", "anemia"]


def test_dictionary_and_link_filter_travel_through_to_bytes(nlp):
    make_matcher(nlp, ["anemia", "liver disease"], merge="fill")
    nlp.add_pipe("link_filter", config={"min_confidence": 0.5})
    nlp.get_pipe("link_filter").min_confidence_dictionary = 0.9  # set after construction, as calibrate does
    data = nlp.to_bytes()
    other = spacy.blank("en")
    other.add_pipe("dictionary_matcher")
    other.add_pipe("link_filter")
    other.from_bytes(data)
    assert other.get_pipe("dictionary_matcher").names == ["anemia", "liver disease"]
    assert other.get_pipe("dictionary_matcher").cfg["merge"] == "fill"
    assert [e.text for e in other("Liver disease , anemia").ents] == ["Liver disease", "anemia"]
    assert (other.get_pipe("link_filter").min_confidence, other.get_pipe("link_filter").min_confidence_dictionary) == (
        0.5,
        0.9,
    )
    with pytest.raises(ConceptNormError, match="E411"):
        DictionaryMatcher(nlp.vocab).from_bytes(b"not json")
    with pytest.raises(ConceptNormError, match="E412"):
        LinkFilter().from_bytes(b'{"min_confidence": 2.0, "drop_nil": false}')


def test_link_filter_settings_on_disk(nlp, tmp_path):
    link_filter = nlp.add_pipe("link_filter", config={"min_confidence": 0.5})
    link_filter.min_confidence_dictionary = 0.9
    nlp.to_disk(tmp_path / "p")
    assert spacy.load(tmp_path / "p").get_pipe("link_filter").min_confidence_dictionary == 0.9
    other = spacy.blank("en")
    other.add_pipe("link_filter")
    assert other.from_disk(tmp_path / "p").get_pipe("link_filter").min_confidence_dictionary == 0.9
    (tmp_path / "p" / "link_filter" / "cfg").unlink()
    with pytest.raises(ConceptNormError, match=r"E412.*link_filter/cfg.*file not found"):
        spacy.load(tmp_path / "p")
    (tmp_path / "p" / "link_filter" / "cfg").write_text('{"min_confidence": 0.5}')
    with pytest.raises(ConceptNormError, match=r"E412.*link_filter/cfg"):
        spacy.load(tmp_path / "p")


def test_dictionary_bad_settings_and_files(nlp, tmp_path):
    with pytest.raises(ConceptNormError, match="E410"):
        DictionaryMatcher(nlp.vocab, merge="union")
    with pytest.raises(ConceptNormError, match="E410"):
        DictionaryMatcher(nlp.vocab, min_precision=2.0)
    (tmp_path / "names.json").write_text("[1, 2]")
    with pytest.raises(ConceptNormError, match=r"E411.*names\.json"):
        DictionaryMatcher(nlp.vocab).from_disk(tmp_path)


def test_dictionary_patterns_load_without_the_tokenizer_and_match_alike(nlp, tmp_path, monkeypatch):
    names = ["anemia", "liver disease", "Non-Hodgkin's lymphoma", "ataxia - telangiectasia"]
    make_matcher(nlp, names)
    nlp.to_disk(tmp_path / "p")
    text = "NON-HODGKIN'S LYMPHOMA , liver disease and ataxia - telangiectasia ; anemia"
    expected = ["NON-HODGKIN'S LYMPHOMA", "liver disease", "ataxia - telangiectasia", "anemia"]
    with monkeypatch.context() as patched:  # the saved patterns are matched as they are: nothing is tokenized
        patched.setattr(DictionaryMatcher, "vocab_tokenizer", lambda self: pytest.fail("names tokenized at load"))
        loaded = spacy.load(tmp_path / "p")
    assert [e.text for e in loaded(text).ents] == expected
    (tmp_path / "p" / "dictionary_matcher" / "patterns.msgpack").unlink()  # saved before patterns were
    assert [e.text for e in spacy.load(tmp_path / "p")(text).ents] == expected


def test_dictionary_patterns_that_do_not_fit_the_names_are_refused(nlp, tmp_path):
    make_matcher(nlp, ["anemia", "liver disease"])
    nlp.to_disk(tmp_path / "p")
    patterns = tmp_path / "p" / "dictionary_matcher" / "patterns.msgpack"
    data = srsly.msgpack_loads(patterns.read_bytes())
    flipped = bytes([data["hashes"][0] ^ 1]) + data["hashes"][1:]
    patterns.write_bytes(srsly.msgpack_dumps({**data, "hashes": flipped}))
    with pytest.raises(ConceptNormError, match=r"E411.*patterns\.msgpack.*checksum does not match"):
        spacy.load(tmp_path / "p")
    lengths = data["lengths"][:4]  # one name's pattern
    patterns.write_bytes(
        srsly.msgpack_dumps({**data, "lengths": lengths, "crc32": zlib.crc32(lengths, zlib.crc32(data["hashes"]))})
    )
    with pytest.raises(ConceptNormError, match=r"E411.*patterns\.msgpack.*2 names, 1 patterns"):
        spacy.load(tmp_path / "p")
    patterns.write_bytes(b"\x93\x01")  # truncated
    with pytest.raises(ConceptNormError, match=r"E411.*patterns\.msgpack"):
        spacy.load(tmp_path / "p")


def test_link_filter_drops_unconfident_and_nil(nlp):
    assert isinstance(nlp.add_pipe("link_filter", name="plain"), LinkFilter)
    link_filter = nlp.add_pipe("link_filter", config={"min_confidence": 0.5, "drop_nil": True})
    doc = nlp.make_doc("anemia and fever and cough and pain")
    doc.ents = [
        Span(doc, i, i + 1, label="Disease", kb_id=kb_id) for i, kb_id in ((0, "D1"), (2, "D2"), (4, "NIL"), (6, "D3"))
    ]
    for ent, confidence in zip(doc.ents, (0.9, 0.2, 0.9, None)):
        ent._.kb_confidence = confidence
    assert [e.text for e in link_filter(doc).ents] == ["anemia", "pain"]  # no confidence: not looked at, kept
    with pytest.raises(ConceptNormError, match="E410"):
        nlp.add_pipe("link_filter", name="bad", config={"min_confidence": -0.1})


def test_link_filter_holds_the_dictionarys_entities_to_their_own_threshold(nlp):
    doc = nlp.make_doc("anemia and fever")
    doc.ents = [Span(doc, 0, 1, label="Disease", kb_id="D1"), Span(doc, 2, 3, label="Disease", kb_id="D2")]
    for ent in doc.ents:
        ent._.kb_confidence = 0.7
    doc.spans["dictionary"] = [doc.ents[1]]  # "fever": the dictionary_matcher added it
    strict = LinkFilter(min_confidence=0.5, min_confidence_dictionary=0.9)
    assert [e.text for e in strict(doc.copy()).ents] == ["anemia"]
    assert [e.text for e in LinkFilter(min_confidence=0.5)(doc.copy()).ents] == ["anemia", "fever"]  # one for all
    other_key = LinkFilter(min_confidence=0.5, min_confidence_dictionary=0.9, spans_key="elsewhere")
    assert [e.text for e in other_key(doc.copy()).ents] == ["anemia", "fever"]
    with pytest.raises(ConceptNormError, match="E410.*min_confidence_dictionary"):
        nlp.add_pipe("link_filter", name="bad", config={"min_confidence_dictionary": 1.5})


def test_dictionary_initialize_from_gold_docs(nlp, fixtures, kb):
    from spacy_conceptnorm.pipeline.dictionary_matcher import gold_docs

    docs = gold_docs(fixtures / "ncbi_train_sample.txt")
    assert gold_docs(None) == []
    matcher = nlp.add_pipe("dictionary_matcher")
    matcher.initialize(lambda: [], kb=kb, docs=docs)
    mentions = {ent.text for doc in docs for ent in doc.ents}
    assert mentions & set(matcher.names)  # the train mentions are names (those precise enough)
    found = {(e.start_char, e.end_char) for e in nlp(docs[0].text).ents}
    assert found & {(e.start_char, e.end_char) for e in docs[0].ents}


def test_recognizers_are_the_components_that_set_entities(nlp):
    from spacy_conceptnorm.evaluation.gold import recognizers

    nlp.add_pipe("ner")
    nlp.add_pipe("dictionary_matcher")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("link_filter")
    assert recognizers(nlp) == ["ner", "dictionary_matcher", "link_filter"]


class _FakeNormalizer:
    """What `tune_link_filter` reads of the concept_normalizer: its KB (every id is its own concept)."""

    class kb:
        @staticmethod
        def resolve(concept_id):
            return concept_id

        @staticmethod
        def matches(gold_id, concept_id):
            return gold_id == concept_id


def _tune_on(nlp, monkeypatch, text, predicted, gold_ents, grid, name, dictionary=()):
    """Tune a link_filter after a fake recognizer+linker: predicted {token: (id, confidence)}, gold [(token, id)],
    `dictionary`: the tokens whose entities the dictionary added."""
    from spacy.language import Language

    from spacy_conceptnorm.evaluation import recognition

    @Language.component(name)
    def fake_linked_ner(doc):
        doc.ents = [Span(doc, i, i + 1, label="Disease", kb_id=cid) for i, (cid, _) in predicted.items()]
        for ent in doc.ents:
            ent._.kb_confidence = predicted[ent.start][1]
        doc.spans["dictionary"] = [ent for ent in doc.ents if ent.start in dictionary]
        return doc

    nlp.add_pipe(name)
    nlp.add_pipe("link_filter", config={"min_confidence": 0.99})  # in no grid: the tuned value must be set
    gold = nlp.make_doc(text)
    gold.ents = [Span(gold, i, i + 1, label="Disease", kb_id=cid) for i, cid in gold_ents]
    monkeypatch.setattr(recognition, "get_normalizer", lambda nlp: ("fake", _FakeNormalizer))
    return recognition.tune_link_filter(nlp, [gold], grid=grid)


def test_tune_link_filter_picks_the_best_threshold_on_dev(nlp, monkeypatch):
    text = "anemia and fever and cough and pain"
    predicted = {0: ("D1", 0.95), 2: ("D2", 0.6), 4: ("X", 0.3), 6: ("D4", 0.75)}  # token -> (id, confidence)
    # gold: anemia D1, fever D2, cough nothing (the "X" entity is spurious), pain D9 (found, linked wrongly)
    gold = [(0, "D1"), (2, "D2"), (6, "D9")]
    result = _tune_on(nlp, monkeypatch, text, predicted, gold, (0.0, 0.5, 0.7, 0.9), "fake_linked_ner_12")
    # NER / NER+linking F1: 0.0: 3 and 2 right of 4 predicted, 3 gold (0.857 / 0.571); 0.5 drops "X" (1.0 / 0.667);
    # 0.7 drops fever too (0.8 / 0.4); 0.9 keeps anemia alone (0.5 / 0.5)
    assert result["min_confidence"] == 0.5
    assert nlp.get_pipe("link_filter").min_confidence == 0.5
    assert nlp.get_pipe_config("link_filter")["min_confidence"] == 0.5
    assert [e.text for e in nlp(text).ents] == ["anemia", "fever", "pain"]
    assert round(result["scores"]["0.0"]["ner_linking"]["f"], 3) == 0.571


def test_tune_link_filter_weighs_the_entities_it_would_drop(nlp, monkeypatch):
    """A threshold that only trades a found entity for linking precision is not taken: NER F1 counts too."""
    text = "anemia and fever and cough"
    predicted = {0: ("D1", 0.95), 2: ("D2", 0.6), 4: ("D3", 0.95)}
    gold = [(0, "D1"), (2, "D9"), (4, "D3")]
    result = _tune_on(nlp, monkeypatch, text, predicted, gold, (0.0, 0.7), "fake_linked_ner_12b")
    # 0.0: NER 3/3 (F1 1.0), linking 2 of 3 (0.667); 0.7 drops fever, linked wrongly: NER 0.8, linking 2/2 of 3
    # gold (0.8): NER+linking alone would take 0.7, the sum (1.667 against 1.6) keeps every entity
    assert round(result["scores"]["0.7"]["ner_linking"]["f"], 3) == 0.8
    assert round(result["scores"]["0.0"]["ner_linking"]["f"], 3) == 0.667
    assert result["min_confidence"] == 0.0
    assert nlp.get_pipe("link_filter").min_confidence == 0.0
    assert [e.text for e in nlp(text).ents] == ["anemia", "fever", "cough"]


def test_tune_link_filter_gives_the_dictionarys_entities_a_threshold_of_their_own(nlp, monkeypatch):
    text = "anemia and fever and cough and pain"
    predicted = {0: ("D1", 0.95), 2: ("D2", 0.6), 4: ("X", 0.7), 6: ("D4", 0.95)}
    gold = [(0, "D1"), (2, "D2"), (6, "D4")]  # "cough", which the dictionary added, is no entity
    result = _tune_on(nlp, monkeypatch, text, predicted, gold, (0.0, 0.5, 0.9), "fake_linked_ner_12c", {4, 6})
    # one threshold for all: 0.0 and 0.5 keep all four (3 of 4 right: F1 6/7 twice), 0.9 keeps anemia and pain (P 1,
    # R 2/3: 0.8 twice). The dictionary's at 0.9 drops "cough" alone: 3 of 3 (1.0 twice), with 0.0 or 0.5 for the
    # recognizer's (a tie: the lower)
    assert round(result["scores"]["0.0"]["ner"]["f"], 4) == round(6 / 7, 4)
    assert round(result["scores"]["0.9"]["ner_linking"]["f"], 4) == 0.8
    assert result["pairs"]["0.5,0.9"]["ner"]["f"] == result["pairs"]["0.0,0.9"]["ner_linking"]["f"] == 1.0
    assert (result["min_confidence"], result["min_confidence_dictionary"]) == (0.0, 0.9)
    assert nlp.get_pipe("link_filter").min_confidence_dictionary == 0.9
    assert nlp.get_pipe_config("link_filter")["min_confidence_dictionary"] == 0.9
    assert [e.text for e in nlp(text).ents] == ["anemia", "fever", "pain"]


def test_tune_link_filter_without_dictionary_entities_keeps_one_threshold(nlp, monkeypatch):
    text = "anemia and fever and cough"
    predicted = {0: ("D1", 0.95), 2: ("D2", 0.6), 4: ("X", 0.3)}
    result = _tune_on(nlp, monkeypatch, text, predicted, [(0, "D1"), (2, "D2")], (0.0, 0.5, 0.9), "fake_ner_12d")
    assert (result["min_confidence"], result["min_confidence_dictionary"]) == (0.5, 0.5)


AFFIXES = {
    "@architectures": "spacy.Tok2Vec.v2",
    "embed": {
        "@architectures": "spacy.MultiHashEmbed.v2",
        "width": 96,
        "attrs": ["NORM", "PREFIX", "SUFFIX", "SHAPE"],
        "rows": [5000, 1000, 2500, 2500],
        "include_static_vectors": False,
    },
    "encode": {
        "@architectures": "spacy.MaxoutWindowEncoder.v2",
        "width": 96,
        "depth": 2,
        "window_size": 1,
        "maxout_pieces": 3,
    },
}


def _trf_nlp(tiny_bert, precision: str, affixes: bool = False):
    """configs/ner_trf.cfg on the tiny BERT with the given cpu_precision, initialized on one doc of TEXT; `affixes`:
    its recognizer as spacy_conceptnorm.TransitionBasedParserWithAffixes.v1 with the CNN of AFFIXES."""
    from pathlib import Path

    from spacy.util import load_config, load_model_from_config

    overrides = {"paths.transformer": str(tiny_bert), "components.transformer.model.cpu_precision": precision}
    config = load_config(Path(__file__).parents[1] / "configs" / "ner_trf.cfg", overrides=overrides, interpolate=True)
    if affixes:
        model = config["components"]["ner"]["model"]
        model["@architectures"] = "spacy_conceptnorm.TransitionBasedParserWithAffixes.v1"
        model["affixes"] = AFFIXES
    nlp = load_model_from_config(config, auto_fill=True)
    examples = [Example(nlp.make_doc(TEXT), doc_with(nlp, ["hereditary breast cancer", "anemia", "diabetes"]))]
    return nlp, examples, nlp.initialize(lambda: examples)


def test_transformer_model_runs_its_forward_pass_in_bf16_and_trains(tiny_bert, tmp_path):
    import torch

    outputs = {}
    for precision in ("fp32", "bf16"):
        nlp, _, _ = _trf_nlp(tiny_bert, precision)
        outputs[precision] = nlp.get_pipe("transformer").model.predict([nlp.make_doc(TEXT)]).model_output
    for value in outputs["bf16"].values():
        assert value.dtype == torch.float32  # the pooler's bf16 output too: numpy cannot hold bf16
    fp32, bf16 = outputs["fp32"].last_hidden_state, outputs["bf16"].last_hidden_state
    difference = (fp32 - bf16).abs().max().item()
    assert 0 < difference < 0.25  # computed in bf16 (not the same bits), yet the same hidden states

    nlp, examples, optimizer = _trf_nlp(tiny_bert, "bf16")
    weight = nlp.get_pipe("transformer").model.transformer.embeddings.word_embeddings.weight
    before = weight.detach().clone()
    for _ in range(3):  # the warm-up schedule's rate is 0 at the first step
        losses = nlp.update(examples, sgd=optimizer)
        optimizer.step_schedules()
    assert losses["ner"] > 0 and torch.isfinite(torch.tensor(losses["ner"]))
    assert not torch.equal(before, weight.detach())  # gradients flowed back through the autocast forward pass

    sourced, vectors, sourced_vectors = _sourced(nlp, tmp_path)
    saved = spacy.util.load_config(tmp_path / "ner" / "config.cfg")
    assert saved["components"]["transformer"]["model"]["cpu_precision"] == "bf16"
    tok2vec = sourced.config["components"]["ner"]["model"]["tok2vec"]
    assert (tok2vec["@architectures"], tok2vec["cpu_precision"]) == ("spacy_conceptnorm.Tok2VecTransformer.v1", "bf16")
    # the same bits: computed in bf16 as before (fp32 would differ in the last places)
    assert np.array_equal(sourced_vectors, vectors)


def test_transformer_model_predicts_on_predict_spans_and_trains_on_get_spans(tiny_bert):
    from spacy.util import registry

    from spacy_conceptnorm.ml.recognizer import transformer_model

    strided = registry.span_getters.get("spacy-transformers.strided_spans.v1")
    model = transformer_model(
        str(tiny_bert), strided(window=8, stride=8), cpu_precision="fp32", predict_spans=strided(window=8, stride=4)
    )
    doc = spacy.blank("en").make_doc(" ".join(["anemia"] * 32))
    model.initialize([doc])
    assert len(model.predict([doc]).spans[0]) == 7  # 32 words: windows from word 0, 4, ..., 24 at inference
    assert len(model.begin_update([doc])[0].spans[0]) == 4  # from 0, 8, 16, 24 in training
    assert len(model.predict([doc]).spans[0]) == 7


def test_windows_predicted_in_groups_give_the_hidden_states_of_the_whole_batch(tiny_bert):
    """More windows than a group holds, of many lengths: each window's hidden states as one padded forward pass
    gives them, in the batch's order and shape."""
    import torch
    from spacy.util import registry
    from thinc.api import ArgsKwargs
    from thinc.shims.pytorch import PyTorchShim

    from spacy_conceptnorm.ml.recognizer import transformer_model
    from spacy_conceptnorm.ml.recognizer_weights import PREDICT_ROWS

    model = transformer_model(str(tiny_bert), registry.span_getters.get("spacy-transformers.strided_spans.v1")(
        window=8, stride=8), cpu_precision="fp32")  # fmt: skip
    model.initialize([spacy.blank("en").make_doc("anemia")])
    shim = model.layers[0].shims[0]
    rows = 3 * PREDICT_ROWS + 1
    lengths = [2 + (7 * row) % 23 for row in range(rows)]  # 2-24 pieces, unsorted
    ids = torch.zeros((rows, max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.arange(length) % 90 + 5
        mask[row, :length] = 1
    inputs = ArgsKwargs(args=(), kwargs={"input_ids": ids, "attention_mask": mask})
    grouped = shim.predict(inputs)
    whole = PyTorchShim.predict(shim, inputs)
    assert grouped.last_hidden_state.shape == whole.last_hidden_state.shape
    for row, length in enumerate(lengths):
        assert torch.allclose(grouped.last_hidden_state[row, :length], whole.last_hidden_state[row, :length], atol=1e-5)
    assert torch.allclose(grouped.pooler_output, whole.pooler_output, atol=1e-5)


def _sourced(nlp, tmp_path):
    """`nlp` saved to tmp_path/ner and loaded, then its recognizer sourced as `spacy assemble` does
    (configs/pipeline.cfg: replace_listeners = ["model.tok2vec"]: the listener becomes a copy of the transformer)
    and saved to tmp_path/sourced and loaded. RETURNS: the sourced pipeline, and the recognizer's token vectors of
    one doc of TEXT before the replacement (the listener reads doc._.trf_data) and after it."""
    nlp.to_disk(tmp_path / "ner")
    loaded = spacy.load(tmp_path / "ner")
    doc = loaded.get_pipe("transformer")(loaded.make_doc(TEXT))
    before = loaded.get_pipe("ner").model.get_ref("tok2vec").predict([doc])[0]
    loaded.replace_listeners("transformer", "ner", ["model.tok2vec"])
    loaded.remove_pipe("transformer")
    loaded.to_disk(tmp_path / "sourced")
    sourced = spacy.load(tmp_path / "sourced")
    return sourced, before, sourced.get_pipe("ner").model.get_ref("tok2vec").predict([doc])[0]


def test_recognizer_reads_each_words_affixes_beside_the_transformer(tiny_bert, tmp_path):
    nlp, examples, optimizer = _trf_nlp(tiny_bert, "fp32", affixes=True)
    architecture = nlp.get_pipe_config("ner")["model"]["@architectures"]
    assert architecture == "spacy_conceptnorm.TransitionBasedParserWithAffixes.v1"
    features = nlp.get_pipe("ner").model.get_ref("tok2vec").layers[0]  # the parser's input, before its projection
    listener, affixes = features.layers
    hidden = AutoConfig.from_pretrained(tiny_bert).hidden_size
    # a token's vector: the transformer's (pooled over its wordpieces), then the 96 of the affix CNN
    assert (listener.get_dim("nO"), affixes.get_dim("nO"), features.get_dim("nO")) == (hidden, 96, hidden + 96)
    doc = nlp.get_pipe("transformer")(nlp.make_doc(TEXT))
    vectors = features.predict([doc])[0]
    assert vectors.shape == (len(doc), hidden + 96)
    tables = [node for node in affixes.walk() if node.name == "hashembed"]
    assert len(tables) == 4  # NORM, PREFIX, SUFFIX, SHAPE
    for table in tables:
        table.set_param("E", table.ops.alloc2f(*table.get_param("E").shape))
    emptied = features.predict([doc])[0]
    assert np.array_equal(emptied[:, :hidden], vectors[:, :hidden])  # the transformer's part is untouched
    assert not np.allclose(emptied[:, hidden:], vectors[:, hidden:])  # the affix part came from the tables

    # trained, saved and sourced as `assemble` does
    for _ in range(3):
        nlp.update(examples, sgd=optimizer)
        optimizer.step_schedules()
    sourced, vectors, sourced_vectors = _sourced(nlp, tmp_path)
    model = sourced.config["components"]["ner"]["model"]
    assert model["@architectures"] == "spacy_conceptnorm.TransitionBasedParserWithAffixes.v1"
    assert (model["tok2vec"]["@architectures"], model["affixes"]["embed"]["width"]) == (
        "spacy_conceptnorm.Tok2VecTransformer.v1",
        96,
    )
    assert np.array_equal(sourced_vectors, vectors)


def test_transformer_model_rejects_an_unknown_cpu_precision(tiny_bert):
    with pytest.raises(ConceptNormError, match="E317.*'fp16'"):
        _trf_nlp(tiny_bert, "fp16")


@pytest.mark.parametrize(
    "overrides,native,steps",  # the same steps whatever the precision and the CPU
    [
        ({"system.cpu_precision": "fp32"}, False, 800),
        ({"system.cpu_precision": "bf16"}, True, 800),
        ({"system.cpu_precision": "auto"}, True, 800),
        ({"system.cpu_precision": "auto"}, False, 800),
        ({"system.cpu_precision": "bf16", "training.max_steps": 100}, True, 100),  # the command line still decides
    ],
)
def test_ner_trf_trains_the_same_steps_on_every_cpu(monkeypatch, overrides, native, steps):
    from pathlib import Path

    from spacy.schemas import ConfigSchemaTraining
    from spacy.util import load_config, load_model_from_config, registry

    import spacy_conceptnorm.ml.recognizer as ner

    monkeypatch.setattr(ner, "cpu_has_native_bf16", lambda: native)
    path = Path(__file__).parents[1] / "configs" / "ner_trf.cfg"
    config = load_config(path, overrides={"paths.train": "train.spacy", "paths.dev": "dev.spacy", **overrides})
    config = load_model_from_config(config, auto_fill=True).config.interpolate()
    assert config["components"]["transformer"]["model"]["cpu_precision"] == overrides["system.cpu_precision"]
    training = registry.resolve(config["training"], schema=ConfigSchemaTraining)
    assert training["max_steps"] == steps
    # warm-up, then linear decay that reaches 0 at the last step, whatever the clock says
    schedule = registry.resolve({"learn_rate": config["training"]["optimizer"]["learn_rate"]})["learn_rate"]
    rates = list(itertools.islice(schedule, steps + 1))
    assert rates[steps] == 0 and rates[steps - 1] > 0
    # no wall clock: the safety stop is off, so every machine trains the same steps
    assert config["training"]["batcher"]["max_minutes"] == 0


@pytest.mark.parametrize("precision,native", itertools.product(["auto", "bf16", "fp32"], [True, False]))
def test_ner_steps_gives_the_same_steps_on_every_cpu(monkeypatch, precision, native):
    """Configs written when the steps followed the CPU name ner_steps.v1: they now train `bf16`'s steps anywhere."""
    import spacy_conceptnorm.ml.recognizer as ner

    monkeypatch.setattr(ner, "cpu_has_native_bf16", lambda: native)
    assert ner.ner_steps(fp32=600, bf16=1200, cpu_precision=precision) == 1200
    resolved = registry_resolve({"@misc": "spacy_conceptnorm.ner_steps.v1", "fp32": 600, "bf16": 1200})
    assert resolved == 1200
    with pytest.raises(ConceptNormError, match="E317"):
        ner.ner_steps(fp32=600, bf16=1200, cpu_precision="fast")


def registry_resolve(section: dict):
    """`section` resolved as spaCy resolves a config's block."""
    from spacy.util import registry

    return registry.resolve({"x": section})["x"]


class _Clock:
    """A stand-in for `time.monotonic` that moves `step` seconds at each reading."""

    def __init__(self, step: float = 0.0):
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_warmup_linear_until_is_thincs_schedule_whatever_the_clock(monkeypatch):
    """Configs name warmup_linear_until.v1 with max_minutes: the rate follows the steps alone, on every machine."""
    from thinc.api import warmup_linear

    import spacy_conceptnorm.training.budget as budget

    clock = _Clock(step=60 * 60)  # an hour passes at every reading
    monkeypatch.setattr(budget, "_now", clock)
    for warmup, total, minutes in ((0, 5, 0), (2, 6, 0), (2, 100, 10)):
        ours = budget.warmup_linear_until(initial_rate=1.0, warmup_steps=warmup, total_steps=total, max_minutes=minutes)
        thincs = warmup_linear(1.0, warmup, total)
        assert list(itertools.islice(ours, total + 2)) == list(itertools.islice(thincs, total + 2))
    resolved = registry_resolve({"@schedules": "spacy_conceptnorm.warmup_linear_until.v1", "initial_rate": 1.0,
                                 "warmup_steps": 2, "total_steps": 6, "max_minutes": 30})  # fmt: skip
    assert list(itertools.islice(resolved, 8)) == list(itertools.islice(warmup_linear(1.0, 2, 6), 8))


def test_batch_until_is_a_safety_stop_that_warns(monkeypatch):
    import warnings

    import spacy_conceptnorm.training.budget as budget

    clock = _Clock()
    monkeypatch.setattr(budget, "_now", clock)
    batcher = budget.batch_until(lambda items: ([item] for item in items), max_minutes=10)
    batches = batcher(range(5))
    assert next(batches) == [0]
    clock.now += 9 * 60
    assert next(batches) == [1]
    clock.now += 60
    with pytest.warns(budget.SafetyStopWarning, match=r"safety stop .*max_minutes = 10\) after 2 steps"):
        assert list(batches) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the later epochs stay quiet
        assert list(batcher(range(5))) == []
    unlimited = budget.batch_until(lambda items: ([item] for item in items), max_minutes=0)
    clock.now += 10**6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(unlimited(range(3))) == [[0], [1], [2]]


def test_ner_trf_training_ends_with_a_warning_when_its_safety_stop_fires(tiny_bert, tmp_path, monkeypatch):
    """spaCy's own loop on configs/ner_trf.cfg: with the clock at a minute a step the safety stop ends it after its
    minutes, far short of max_steps and of its (finite) epochs, warns, and saves the model."""
    import io
    from pathlib import Path

    from spacy.tokens import DocBin
    from spacy.training.initialize import init_nlp
    from spacy.training.loop import train
    from spacy.util import load_config, registry

    import spacy_conceptnorm.training.budget as budget

    vocab = spacy.blank("en")
    DocBin(docs=[doc_with(vocab, ["hereditary breast cancer", "anemia", "diabetes"])]).to_disk(tmp_path / "c.spacy")
    steps = []
    registry.callbacks.register(
        "spacy_conceptnorm_test.count_steps.v1", func=lambda: lambda nlp, args: steps.append(args["step"])
    )
    overrides = {
        "paths.train": str(tmp_path / "c.spacy"), "paths.dev": str(tmp_path / "c.spacy"),
        "paths.transformer": str(tiny_bert), "system.cpu_precision": "fp32", "system.max_minutes": 4,
        "training.before_update": {"@callbacks": "spacy_conceptnorm_test.count_steps.v1"},
    }  # fmt: skip
    config = load_config(Path(__file__).parents[1] / "configs" / "ner_trf.cfg", overrides=overrides)
    assert config["training"]["max_epochs"] > 0  # 0 (no end): once the time is up the loop would spin forever
    monkeypatch.setattr(budget, "_now", _Clock(step=60))  # the batcher reads it once a step
    nlp = init_nlp(config)
    (tmp_path / "out").mkdir()
    with pytest.warns(budget.SafetyStopWarning, match="spacy train stopped by its wall-clock safety stop"):
        train(nlp, tmp_path / "out", stdout=io.StringIO(), stderr=io.StringIO())
    assert 3 <= len(steps) <= 5  # one abstract a step: without the stop, 20 epochs = 20 steps
    assert (tmp_path / "out" / "model-last" / "config.cfg").exists()
