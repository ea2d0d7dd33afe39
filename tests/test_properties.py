"""Property-based tests (hypothesis): the KB loaders, the normalizer, the abbreviation resolver, the
composite splitter and the linker on arbitrary text and entity spans. Whatever the input: no exception other than
the package's ConceptNormError, spans and offsets inside the text, `kb_ents` a list of (concept id, score) tuples.
The pure string algorithms of `spacy_conceptnorm.text` keep their rules' promises on any text: a definition is found
where it is written, parts of a composite mention are made of its own words, protected names stay whole.

Examples per property: 200 in the default run (CI), 2,000 with HYPOTHESIS_PROFILE=thorough.
"""

import gzip
import math
import os
import re
import tempfile
import warnings
from pathlib import Path

import pytest
import spacy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from spacy.language import Language
from spacy.tokens import Span

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.formats import READERS
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.text.abbreviations import Abbreviation, find_abbreviations, is_short_form
from spacy_conceptnorm.text.composites import MAX_CHARS, split_composite
from spacy_conceptnorm.text.normalize import TextNormalizer

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

settings.register_profile(
    "ci", max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# words that reach the rules' branches (conjunctions, prepositions, parentheses, short forms, the splitter's own
# placeholder characters, separators of the KB formats) mixed with any text
WORDS = ["breast", "and", "or", "ovarian", "cancer", "cancers", ",", "(", ")", "/", "of", "the", "in", "type", "1",
         "2", "non", "plus", "vs", "+", "-", "BRCA1-", "HNPCC", "hereditary", "nonpolyposis", "colorectal", "C2",
         "hand, foot and mouth disease", "\ue000", "\ue0000\ue001", "\ue0009\ue001", "|", "||", "\t", ":",
         "[Term]", "id:", "name:", "synonym:", '"', "{", "}", "\n", "\r", "\ufeff", "MESH:D001943", "OMIM:114480",
         "Sjögren", "ﬁ", "İ"]  # fmt: skip
ANY = st.text(st.characters(), max_size=40)
TEXT = st.lists(st.sampled_from(WORDS) | ANY, max_size=25).map(" ".join)
DOC_TEXT = st.lists(
    st.sampled_from(WORDS) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20), max_size=25
).map(" ".join)  # spaCy's tokenizer needs text that can be UTF-8: no lone surrogates


@spacy.registry.misc("test_properties.trigram_encoder.v1")
def trigram_encoder() -> TrigramEncoder:
    return TrigramEncoder()


@pytest.fixture(scope="module")
def nlp(tmp_path_factory) -> Language:
    lines = (FIXTURES / "medic_sample.txt").read_text().splitlines()
    kb_file = tmp_path_factory.mktemp("kb") / "medic.txt"
    kb_file.write_text("\n".join(lines[::10]) + "\n")  # a tenth of the sample: each example links in milliseconds
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("composite_splitter")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": {"@misc": "test_properties.trigram_encoder.v1"}})
    normalizer.initialize(nlp=nlp, kb=load_kb(kb_file))
    return nlp


# --- knowledge base loaders ---------------------------------------------------------------------------------------
def _load(content: bytes, fmt: str, suffix: str = "") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"kb.txt{suffix}"
        path.write_bytes(content)
        try:
            kb = load_kb(path, format=fmt)
        except ConceptNormError:
            return
    assert len(kb) >= 1
    for name in kb.names():
        assert name == name.strip() and all(kb.resolve(cid) for cid in kb.concepts_for(name))


@given(st.lists(TEXT, max_size=8).map("\n".join), st.sampled_from(sorted(READERS)))
def test_kb_loaders_on_any_text(text, fmt):
    _load(text.encode("utf-8", "surrogatepass"), fmt)


@given(st.binary(max_size=300), st.sampled_from(sorted(READERS)), st.sampled_from(["", ".gz"]))
def test_kb_loaders_on_any_bytes(content, fmt, suffix):
    if suffix and content[:1] == b"+":  # a valid gzip stream around the bytes, cut short at the end
        content = gzip.compress(content)[: -len(content) // 2 or None]
    _load(content, fmt, suffix)


# --- text functions -----------------------------------------------------------------------------------------------
@given(TEXT)
def test_the_normalizer_gives_stripped_single_spaced_keys(text):
    key = TextNormalizer()(text)
    assert key == key.strip() and "  " not in key
    assert TextNormalizer()(key) == key  # stored keys are found again when normalized twice


@given(TEXT)
def test_abbreviations_point_into_the_text(text):
    for a in find_abbreviations(text):
        assert 0 <= a.short_start < a.short_end <= len(text) and 0 <= a.long_start < a.long_end <= len(text)
        assert text[a.short_start : a.short_end] == a.short and text[a.long_start : a.long_end] == a.long


@given(TEXT, st.lists(TEXT, max_size=3), st.booleans())
def test_the_composite_splitter_gives_parts(text, protected, interventions):
    try:
        parts = split_composite(text, protected=protected, split_interventions=interventions)
    except ConceptNormError:
        return
    assert parts and all(isinstance(p, str) for p in parts)
    assert len(parts) == 1 or all(p.strip() for p in parts)


@given(TEXT)
def test_abbreviations_keep_the_schwartz_hearst_constraints(text):
    found = find_abbreviations(text)
    starts = [a.short_start for a in found]
    assert starts == sorted(set(starts))  # in text order, one definition per parenthesised group
    for a in found:
        assert is_short_form(a.short) and len(a.long) >= len(a.short)
        assert a.short_end <= a.long_start or a.long_end <= a.short_start  # one outside the parentheses, one in
        assert not re.search(rf"(?<!\w){re.escape(a.short)}(?!\w)", a.long)
        assert Abbreviation(**a.to_dict()) == a  # what `doc._.abbreviations` stores gives the definition back


# Long-form words whose initials occur nowhere else in the long form, so the initials match their own words only.
INITIALS, TAILS = "bcdfghjklm", "aeiounprstvwxyz"
LONG_FORM_WORDS = st.lists(
    st.tuples(st.sampled_from(INITIALS), st.text(TAILS, max_size=8)).map("".join), min_size=2, max_size=6
)


@given(st.text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ", max_size=40), LONG_FORM_WORDS, st.booleans())
def test_a_definition_by_initials_is_found_where_it_is_written(sentence, words, long_first):
    long = " ".join(words)
    short = "".join(word[0] for word in words).upper()
    start = len(sentence) + 2
    if long_first:  # "... long form (LF) was studied."
        text = f"{sentence}. {long} ({short}) was studied."
        short_start, long_start = start + len(long) + 2, start
    else:  # "... LF (long form) was studied."
        text = f"{sentence}. {short} ({long}) was studied."
        short_start, long_start = start, start + len(short) + 2
    expected = Abbreviation(short, long, short_start, short_start + len(short), long_start, long_start + len(long))
    assert find_abbreviations(text) == [expected]


@given(TEXT, st.booleans())
def test_composite_parts_are_made_of_the_mentions_words(text, interventions):
    parts = split_composite(text, split_interventions=interventions)
    if len(parts) == 1:
        assert parts == [text]
        return
    words = set(re.findall(r"\w+", text))
    for part in parts:
        assert part == " ".join(part.split())  # stripped, single-spaced
        assert set(re.findall(r"\w+", part)) <= words  # the rules share and complete words, never invent one


@given(TEXT)
def test_spacing_does_not_change_a_split(text):
    respaced = "  ".join(text.split()) + "\n"
    assume(len(text) <= MAX_CHARS and len(respaced) <= MAX_CHARS)  # a longer mention is never split
    parts = split_composite(text)
    if len(parts) >= 2:
        assert split_composite(respaced) == parts
    else:
        assert split_composite(respaced) == [respaced]


@given(TEXT)
def test_a_protected_name_is_never_split(name):
    assume(name.strip())
    assert split_composite(name, protected=[name]) == [name]
    assert split_composite(name, is_known_name=lambda text: text == " ".join(name.split())) == [name]


WORD = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1, max_size=12)


def _no_conjunction(word: str) -> bool:
    return word.lower() not in {"and", "or", "plus", "vs", "versus"} and not word.lower().startswith("combin")


@given(st.lists(WORD.filter(_no_conjunction), min_size=1, max_size=10))
def test_a_mention_without_a_conjunction_is_not_split(words):
    text = " ".join(words)
    assert split_composite(text) == [text]


# --- the pipeline: abbreviation_resolver -> composite_splitter -> concept_normalizer --------------------------------
BLANK = spacy.blank("en")


@st.composite
def docs_with_spans(draw):
    text = draw(DOC_TEXT)
    n_tokens = len(BLANK.make_doc(text))
    cuts = sorted(draw(st.sets(st.integers(0, n_tokens), max_size=8)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if a < b]
    return text, spans


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(docs_with_spans())
def test_the_linker_keeps_spans_and_kb_ents_shape(nlp, case):
    text, spans = case
    doc = nlp.make_doc(text)
    doc.ents = [Span(doc, a, b, label="Disease") for a, b in spans]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = nlp(doc)
    assert [(e.start, e.end) for e in doc.ents] == spans
    for ent in doc.ents:
        assert 0 <= ent.start_char <= ent.end_char <= len(doc.text)
        assert isinstance(ent.kb_id_, str) and ent.kb_id_
        assert isinstance(ent._.kb_ents, list)
        for cid, score in ent._.kb_ents:
            assert isinstance(cid, str) and isinstance(score, float) and math.isfinite(score)
        assert ent._.kb_confidence is None or 0.0 <= ent._.kb_confidence <= 1.0 + 1e-6
        long_form = ent._.long_form
        assert long_form is None or isinstance(long_form, str)
        assert ent._.composite_parts is None or all(isinstance(p, str) for p in ent._.composite_parts)


# --- the sentence splitter (text.sentences) ---

from spacy_conceptnorm.text.sentences import ABBREVIATIONS, DOSING, sentence_starts  # noqa: E402

LOWER_WORD = st.text("abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=12).filter(lambda w: w not in ABBREVIATIONS)
CAPITAL_WORD = st.builds(str.__add__, st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), st.text("abcxyz", max_size=8))
PIECES = [*"abcXYZ019 .,:;!?-*()\"'\n\t", "Dr.", "e.g.", "\n\n", "\n1. ", "\u00a0"]
SENTENCE_TEXT = st.lists(st.sampled_from(PIECES), max_size=30).map("".join) | st.text(max_size=60)


@given(SENTENCE_TEXT)
def test_sentence_starts_are_sorted_and_within_the_text(text):
    starts = sentence_starts(text)
    assert starts[0] == 0
    assert starts == sorted(set(starts))
    for start in starts[1:]:
        assert 0 < start < len(text)
        assert not text[start].isspace() and text[start - 1].isspace()  # a word after white space


@given(SENTENCE_TEXT, LOWER_WORD, CAPITAL_WORD, SENTENCE_TEXT)
def test_a_full_stop_after_a_word_before_a_capital_starts_a_sentence(before, word, capital, after):
    text = f"{before} {word}. {capital}{after}"
    assert len(text) - len(capital + after) in sentence_starts(text)


@given(SENTENCE_TEXT, st.sampled_from(sorted(ABBREVIATIONS) + ["J", "Q"]), CAPITAL_WORD, SENTENCE_TEXT)
def test_an_abbreviation_or_an_initial_starts_no_sentence(before, abbreviation, capital, after):
    text = f"{before} {abbreviation}. {capital}{after}"
    assert len(text) - len(capital + after) not in sentence_starts(text)


@given(SENTENCE_TEXT, st.sampled_from(["- ", "* ", "\u2022 ", "\n", "\nFH: ", "\nGEN: "]), SENTENCE_TEXT)
def test_a_bullet_a_blank_line_or_a_label_starts_a_sentence(before, marker, after):
    text = f"{before}\n{marker}x{after}"
    first = len(before) + 1 + len(marker) - len(marker.lstrip("\n"))
    assert first in sentence_starts(text)


@given(SENTENCE_TEXT, LOWER_WORD, LOWER_WORD, SENTENCE_TEXT)
def test_a_line_broken_between_lower_case_words_goes_on(before, word, next_word, after):
    text = f"{before} {word}\n{next_word}{after}"
    assert len(before) + len(word) + 2 not in sentence_starts(text)


@given(SENTENCE_TEXT, st.sampled_from(sorted(DOSING)), CAPITAL_WORD, LOWER_WORD)
def test_a_dosing_frequency_ends_a_sentence_only_before_a_capital(before, dosing, capital, word):
    for case in (dosing, dosing.upper()):
        assert len(f"{before} 5 mg {case}. ") in sentence_starts(f"{before} 5 mg {case}. {capital} daily")
        assert len(f"{before} 5 mg {case}. ") not in sentence_starts(f"{before} 5 mg {case}. {word} meals")
