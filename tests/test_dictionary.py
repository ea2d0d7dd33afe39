"""The dictionary_matcher's own matching (`TokenPatterns`) against spaCy's `PhraseMatcher` as the oracle: every
occurrence of every name, then the same longest-first filter, on hand-written names and on random token sequences;
its batches, its saved patterns' error paths."""

import numpy as np
import pytest
import spacy
import srsly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spacy.matcher import PhraseMatcher
from spacy.tokens import Doc
from spacy.util import filter_spans

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.pipeline.dictionary_matcher import MULTIPLIER, DictionaryMatcher, TokenPatterns

NAMES = [
    "breast cancer", "hereditary breast cancer", "hereditary breast and ovarian cancer", "ovarian cancer", "cancer",
    "Breast Cancer", "anemia", "a", "ataxia - telangiectasia", "telangiectasia", "cancer cancer", "ovarian",
    "cancer breast",
]  # fmt: skip
TEXTS = [
    "Hereditary breast and ovarian cancer ; hereditary BREAST CANCER and breast cancer",
    "cancer cancer cancer , anemia anemia ; a A a",
    "ataxia - telangiectasia , telangiectasia and ataxia - telangiectasia - like disorder",
    "cancer breast cancer breast",
    "",
    "no name here",
    "ovarian",
]


@pytest.fixture(scope="module")
def nlp():
    return spacy.blank("en")


def oracle(nlp, names: list[list[str]], docs: list[Doc]) -> list[list[tuple[int, int]]]:
    """spaCy's PhraseMatcher on LOWER over the names: every match's (start, end), sorted, per doc."""
    matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
    matcher.add("Disease", [Doc(nlp.vocab, words=name) for name in names])
    return [sorted((start, end) for _, start, end in matcher(doc)) for doc in docs]


def patterns(nlp, names: list[list[str]], multiplier: int = MULTIPLIER) -> TokenPatterns:
    tokens = [Doc(nlp.vocab, words=name).to_array("LOWER") for name in names]
    hashes = np.concatenate(tokens).astype(np.uint64) if tokens else np.zeros(0, dtype=np.uint64)
    return TokenPatterns(hashes, np.array([len(t) for t in tokens], dtype=np.uint32), multiplier)


@pytest.mark.parametrize("multiplier", [MULTIPLIER, 1])  # 1: a key is the sum of its tokens, so orders collide
def test_every_occurrence_as_the_phrase_matcher_finds_them(nlp, multiplier):
    names = [[t.text for t in nlp.make_doc(name)] for name in NAMES]
    docs = [nlp.make_doc(text) for text in TEXTS]
    found = patterns(nlp, names, multiplier).find([doc.to_array("LOWER") for doc in docs])
    assert found == oracle(nlp, names, docs)
    assert found[3] == [(0, 1), (0, 2), (1, 3), (2, 3), (2, 4)]  # "cancer breast" and "breast cancer"
    assert found[1][:3] == [(0, 1), (0, 2), (1, 2)]  # "cancer", "cancer cancer", overlapping ones too


def test_match_is_the_longest_of_overlapping_matches_as_filter_spans_keeps_them(nlp):
    matcher = DictionaryMatcher(nlp.vocab)
    matcher.set_names(NAMES)
    docs = [nlp.make_doc(text) for text in TEXTS]
    names = [[t.text for t in nlp.make_doc(name)] for name in NAMES if len(name) >= 2]  # min_length
    expected = [filter_spans([doc[s:e] for s, e in spans]) for doc, spans in zip(docs, oracle(nlp, names, docs))]
    for doc, spans in zip(docs, expected):
        assert [(s.start, s.end, s.label_) for s in matcher.match(doc)] == [(s.start, s.end, "Disease") for s in spans]
    assert [[s.text for s in spans] for spans in matcher.matches(docs)] == [[s.text for s in e] for e in expected]
    first = ["Hereditary breast and ovarian cancer", "hereditary BREAST CANCER", "breast cancer"]
    assert [s.text for s in matcher.match(docs[0])] == first


WORDS = st.sampled_from(["a", "A", "b", "c"])  # a tiny vocabulary: names overlap, repeat and nest


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=st.lists(st.lists(WORDS, min_size=1, max_size=4), max_size=8),
    texts=st.lists(st.lists(WORDS, max_size=16), min_size=1, max_size=4),
    multiplier=st.sampled_from([MULTIPLIER, 1, 3]),
)
def test_random_sequences_match_as_the_phrase_matcher(nlp, names, texts, multiplier):
    docs = [Doc(nlp.vocab, words=words) for words in texts]
    assert patterns(nlp, names, multiplier).find([doc.to_array("LOWER") for doc in docs]) == oracle(nlp, names, docs)


def test_nothing_to_find(nlp):
    assert patterns(nlp, []).find([nlp.make_doc("a b").to_array("LOWER")]) == [[]]
    assert patterns(nlp, [["a"]]).find([]) == []
    assert patterns(nlp, [["a", "b", "c"]]).find([nlp.make_doc("a b").to_array("LOWER"), np.zeros(0, np.uint64)]) == [
        [],
        [],
    ]  # the only name is longer than the docs: no window runs past a doc's end into the next
    empty = TokenPatterns(np.zeros(0, dtype=np.uint64), np.zeros(2, dtype=np.uint32))  # two names of no token
    assert empty.find([nlp.make_doc("a").to_array("LOWER")]) == [[]]


def test_pipe_matches_batches_as_one_doc_at_a_time(nlp):
    one = spacy.blank("en")
    one.add_pipe("dictionary_matcher").set_names(NAMES)
    texts = TEXTS * 3
    single = [[(e.start, e.end) for e in one(text).ents] for text in texts]
    assert [[(e.start, e.end) for e in doc.ents] for doc in one.pipe(texts, batch_size=4)] == single
    assert single[0] == [(0, 5), (6, 9), (10, 12)]


def test_saved_patterns_that_contradict_the_names_are_refused(nlp, tmp_path):
    matcher = DictionaryMatcher(nlp.vocab)
    matcher.set_names(["anemia", "liver disease"])
    data = srsly.msgpack_loads(matcher.to_bytes())
    assert DictionaryMatcher(nlp.vocab).from_bytes(matcher.to_bytes()).match(nlp.make_doc("liver disease"))
    for broken, detail in (
        ({**data, "cfg": {**data["cfg"], "attr": "ORTH"}}, "2 names, 2 patterns of 'LOWER'"),
        ({**data, "hashes": data["hashes"][:8]}, "checksum does not match"),
        ({key: value for key, value in data.items() if key != "crc32"}, "crc32"),
        ({**data, "lengths": b"\x00"}, "buffer size must be a multiple"),
    ):
        with pytest.raises(ConceptNormError, match=f"E411.*the bytes given.*{detail}"):
            DictionaryMatcher(nlp.vocab).from_bytes(srsly.msgpack_dumps(broken))
