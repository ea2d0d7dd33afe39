"""Abbreviation resolution: find the short forms a text defines and expand them on its entities.

A definition is a long form with its short form in parentheses, "hereditary nonpolyposis colorectal cancer (HNPCC)",
or the reverse, "FAP (familial adenomatous polyposis)". The `abbreviation_resolver` component finds the
definitions of each doc, records them in `doc._.abbreviations` and sets `span._.long_form` on every entity that is,
or contains as whole tokens, a defined short form, so that a later component can link "HNPCC" through
"hereditary nonpolyposis colorectal cancer".

Clinical notes use abbreviations they never define ("65M with CHF and DM2 presents with SOB"). The
`clinical_abbreviations` component, after the resolver, knows a short list of common clinical abbreviations of
conditions (`CLINICAL_ABBREVIATIONS`): where the doc does not define such a short form, it expands each occurrence
as the resolver expands a defined one, and makes an entity of each occurrence that no entity overlaps.

Two detectors: a plain-Python Schwartz & Hearst (2003) algorithm, and Ab3P (Sohn et al. 2008) through the
optional `pyab3p` package.
"""

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors

if not Doc.has_extension("abbreviations"):
    Doc.set_extension("abbreviations", default=None)
if not Span.has_extension("long_form"):
    Span.set_extension("long_form", default=None)


@dataclass(frozen=True)
class Abbreviation:
    """A short form defined in a text by a long form next to it. Offsets are end-exclusive character offsets.

    short (str): The short form, e.g. "HNPCC".
    long (str): The long form, e.g. "hereditary nonpolyposis colorectal cancer".
    short_start (int): Where the defining occurrence of the short form starts.
    short_end (int): Where it ends.
    long_start (int): Where the long form starts.
    long_end (int): Where it ends.
    """

    short: str
    long: str
    short_start: int
    short_end: int
    long_start: int
    long_end: int

    def to_dict(self) -> dict[str, str | int]:
        """RETURNS (Dict[str, Union[str, int]]): The fields as a JSON- and msgpack-serializable dict."""
        return dataclasses.asdict(self)


# A parenthesised group after whitespace, with at most one level of nested parentheses inside.
_PARENTHESES = re.compile(r"(?<=\s)\(((?:[^()]|\([^()]*\))*)\)")
# Where a long form may not reach back past: the end of a sentence or clause.
_BOUNDARY = re.compile(r"[.!?;,]\s")


def find_abbreviations(text: str) -> list[Abbreviation]:
    """Find short-form/long-form definitions with the Schwartz & Hearst (2003) algorithm.

    Each parenthesised group is tried first as "long form (SF)", then as "SF (long form)". Text inside the
    parentheses after "; " or ", " is dropped ("(HNPCC; ref. 3)"). A long form does not reach back past the end of
    a sentence or clause (". ", ", " and the like) nor into an earlier parenthesised group.

    text (str): The text to search.
    RETURNS (List[Abbreviation]): The definitions, in text order.
    """
    found = []
    region_start = 0  # where the text before the current group may begin
    for match in _PARENTHESES.finditer(text):
        open_index, close_index = match.start(), match.end() - 1
        boundaries = [b.end() for b in _BOUNDARY.finditer(text, region_start, open_index)]
        before_start = max([region_start, *boundaries])
        inner_start = open_index + 1
        inner_end = inner_start + len(re.split(r"[;,]\s", match.group(1), maxsplit=1)[0])
        # "long form (SF)": the short form inside the parentheses, the long form before them.
        abbreviation = _match(text, _strip(text, inner_start, inner_end), _strip(text, before_start, open_index))
        if abbreviation is None:
            # "SF (long form)": the short form is the word before the parentheses, and has a capital letter.
            word_end = word_start = _strip(text, before_start, open_index)[1]
            while word_start > before_start and not text[word_start - 1].isspace():
                word_start -= 1
            if any(c.isupper() for c in text[word_start:word_end]):
                abbreviation = _match(text, (word_start, word_end), _strip(text, inner_start, inner_end))
        if abbreviation is not None:
            found.append(abbreviation)
        region_start = close_index + 1
    return found


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    """The (start, end) offsets of text[start:end] without its leading and trailing whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def is_short_form(text: str) -> bool:
    """Whether a string can be a short form: 2 to 10 characters in at most two words, starting with a letter or
    digit and containing a letter.

    text (str): The candidate.
    RETURNS (bool): Whether it is valid.
    """
    return 2 <= len(text) <= 10 and len(text.split()) <= 2 and text[0].isalnum() and any(c.isalpha() for c in text)


def _match(text: str, short: tuple[int, int], candidate: tuple[int, int]) -> Abbreviation | None:
    """Find the long form of the short form text[slice(*short)] at the end of text[slice(*candidate)].

    The short form's letters and digits are matched right to left against the candidate, each to the nearest
    same character (case-insensitive) further left; the first one must start a word. The long form runs from
    the start of the whitespace-separated word holding that first match to the end of the candidate.
    """
    short_form = text[short[0] : short[1]]
    if not is_short_form(short_form):
        return None
    position = candidate[1] - 1
    for index in range(len(short_form) - 1, -1, -1):
        char = short_form[index].lower()
        if not char.isalnum():
            continue
        while position >= candidate[0] and (
            text[position].lower() != char or (index == 0 and position > candidate[0] and text[position - 1].isalnum())
        ):
            position -= 1
        if position < candidate[0]:
            return None
        position -= 1
    while position >= candidate[0] and not text[position].isspace():
        position -= 1
    long_form = text[position + 1 : candidate[1]]
    n_chars = sum(c.isalnum() for c in short_form)
    if (
        len(long_form) < len(short_form)
        or re.search(rf"(?<!\w){re.escape(short_form)}(?!\w)", long_form)
        or len(long_form.split()) > min(n_chars + 5, 2 * n_chars)
    ):
        return None
    return Abbreviation(short_form, long_form, short[0], short[1], position + 1, candidate[1])


@functools.cache
def _ab3p():
    """The process's Ab3P instance, created on first use (never stored on a component, so nothing unpicklable is)."""
    try:
        from pyab3p import Ab3p
    except ImportError:
        raise ImportError(Errors.E402) from None
    return Ab3p()


def find_abbreviations_ab3p(text: str) -> list[Abbreviation]:
    """Find short-form/long-form definitions with Ab3P (needs the `pyab3p` package).

    text (str): The text to search.
    RETURNS (List[Abbreviation]): The definitions, in text order.
    """
    # Ab3P's offsets go wrong in a sentence with a run of whitespace, so it reads each run as one space, and
    # its offsets, into the UTF-8 bytes of that squeezed text, are mapped back to characters of `text`.
    kept = [i for i, char in enumerate(text) if not (char.isspace() and i > 0 and text[i - 1].isspace())]
    squeezed = "".join(" " if text[i].isspace() else text[i] for i in kept)
    data = squeezed.encode("utf-8")

    def span(byte_offset: int, length: int) -> tuple[int, int]:
        start = byte_offset if len(data) == len(squeezed) else len(data[:byte_offset].decode("utf-8", "ignore"))
        end = min(start + length, len(kept))
        return (kept[start], kept[end - 1] + 1) if start < end else (0, 0)

    found = []
    for result in _ab3p().get_abbrs(squeezed):
        short_start, short_end = span(result.short_form_offset, len(result.short_form))
        long_start, long_end = span(result.long_form_offset, len(result.long_form))
        short, long = text[short_start:short_end], text[long_start:long_end]
        # Ab3P's offsets are sometimes off (e.g. when a sentence repeats): keep only results found where it says.
        if short == result.short_form and " ".join(long.split()) == result.long_form:
            found.append(Abbreviation(short, long, short_start, short_end, long_start, long_end))
    return sorted(found, key=lambda a: a.short_start)


# Common clinical abbreviations of conditions and their usual expansion in clinical notes, written for this package
# from common clinical usage; each expansion is a name of the condition in MEDIC (CTD's disease vocabulary), so that
# the linker finds it. An abbreviation with another frequent sense is left out: in notes PE (physical exam), RA
# (room air), MS (mental status), CP, CA, ED, HA, AS, AF; in the literature DM and DM1 (myotonic dystrophy).
CLINICAL_ABBREVIATIONS: dict[str, str] = {
    "ACS": "acute coronary syndrome",
    "AFib": "atrial fibrillation",
    "Afib": "atrial fibrillation",
    "afib": "atrial fibrillation",
    "A-fib": "atrial fibrillation",
    "AKI": "acute kidney injury",
    "BPH": "benign prostatic hyperplasia",
    "CAD": "coronary artery disease",
    "CHF": "congestive heart failure",
    "CKD": "chronic kidney disease",
    "CVA": "stroke",
    "DM2": "type 2 diabetes mellitus",
    "DVT": "deep vein thrombosis",
    "GIB": "gastrointestinal hemorrhage",
    "HCV": "hepatitis C",
    "HF": "heart failure",
    "HLD": "hyperlipidemia",
    "HTN": "hypertension",
    "LBP": "low back pain",
    "MDD": "major depressive disorder",
    "MI": "myocardial infarction",
    "OA": "osteoarthritis",
    "OSA": "obstructive sleep apnea",
    "PAD": "peripheral arterial disease",
    "PNA": "pneumonia",
    "PVD": "peripheral vascular disease",
    "SOB": "shortness of breath",
    "T1DM": "type 1 diabetes mellitus",
    "T2DM": "type 2 diabetes mellitus",
    "TIA": "transient ischemic attack",
    "UTI": "urinary tract infection",
}

# A short form's occurrence: its start and end character offsets, and its definition in the text or, for a
# clinical abbreviation the text does not define, its listed long form.
Occurrence = tuple[int, int, Abbreviation | str]


DETECTORS: dict[str, Callable[[str], list[Abbreviation]]] = {
    "schwartz_hearst": find_abbreviations,
    "ab3p": find_abbreviations_ab3p,
}


class AbbreviationResolver(Pipe):
    """Find abbreviation definitions in each doc and expand short forms on its entities.

    Sets `doc._.abbreviations` to a list of dicts (`Abbreviation.to_dict()`: short, long, short_start, short_end,
    long_start, long_end), one per definition, and `ent._.long_form` on each entity of `doc.ents` that is, or
    contains as whole tokens, a defined short form: the entity text with each short form replaced by its long
    form ("HNPCC patients" -> "hereditary nonpolyposis colorectal cancer patients"). A plural "HNPCCs" expands
    like "HNPCC". When a short form is defined twice, the first definition is used. Tokens and `doc.ents` are
    left as they are, and the component has no learned state.

    The values are plain str/int/list/dict data in `doc.user_data` (span values keyed by character offsets), so
    they survive `DocBin(store_user_data=True)`, which reads the list back as a tuple, and `nlp.pipe(...,
    n_process=2)`.
    """

    def __init__(
        self,
        vocab: Vocab,
        name: str = "abbreviation_resolver",
        *,
        detector: str = "schwartz_hearst",
        propagate: bool = True,
        expand_undefined_uppercase: bool = False,
    ) -> None:
        """Initialize the component.

        vocab (Vocab): The shared vocabulary.
        name (str): The component instance name.
        detector (str): "schwartz_hearst" (pure Python) or "ab3p" (needs the pyab3p package).
        propagate (bool): Expand every occurrence of a short form in the doc, not only the one in the definition.
        expand_undefined_uppercase (bool): For an all-uppercase entity whose text no definition in the doc covers,
            use the text of the nearest earlier entity with the same label that is not itself all-uppercase
            (Mondal et al. 2019). The first occurrence decides for all occurrences of the same text.
        """
        if detector not in DETECTORS:
            raise ConceptNormError(Errors.E401.format(detector=detector, choices=sorted(DETECTORS)))
        if detector == "ab3p":
            _ab3p()  # fail now, not on the first doc, when pyab3p is missing
        self.vocab = vocab
        self.name = name
        self.detector = detector
        self.propagate = propagate
        self.expand_undefined_uppercase = expand_undefined_uppercase

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a doc.

        doc (Doc): The document, with its entities set.
        RETURNS (Doc): The same doc, with `doc._.abbreviations` and `ent._.long_form` set.
        """
        text = doc.text  # spaCy joins the tokens' texts anew at each `doc.text`
        abbreviations = DETECTORS[self.detector](text)
        doc._.abbreviations = [abbreviation.to_dict() for abbreviation in abbreviations]
        occurrences = self._occurrences(doc, text, abbreviations)
        defined = {abbreviation.short for abbreviation in abbreviations}
        guesses: dict[str, str | None] = {}
        previous: dict[str, str] = {}  # label -> text of the last entity that is not an uppercase abbreviation
        for ent in doc.ents:
            long_form = _expand(ent, text, occurrences)
            uppercase = _is_uppercase_abbreviation(ent.text)
            if long_form is None and uppercase and self.expand_undefined_uppercase and ent.text not in defined:
                long_form = guesses.setdefault(ent.text, previous.get(ent.label_))
            if not uppercase:
                previous[ent.label_] = ent.text
            if long_form is not None:
                ent._.long_form = long_form
        return doc

    def _occurrences(self, doc: Doc, text: str, abbreviations: list[Abbreviation]) -> list[Occurrence]:
        """The (start, end, definition) of each short form occurrence that starts and ends on token boundaries,
        in text order, without overlaps (the longer short form wins)."""
        first: dict[str, Abbreviation] = {}
        for abbreviation in abbreviations:
            first.setdefault(abbreviation.short, abbreviation)
        if self.propagate:
            found = _find(doc, text, first)
        else:
            found = [(a.short_start, a.short_end, a) for a in first.values()]
        return _without_overlaps(found)


@Language.factory(
    "abbreviation_resolver",
    assigns=["doc._.abbreviations", "span._.long_form"],
    default_config={"detector": "schwartz_hearst", "propagate": True, "expand_undefined_uppercase": False},
)
def make_abbreviation_resolver(
    nlp: Language, name: str, detector: str, propagate: bool, expand_undefined_uppercase: bool
) -> AbbreviationResolver:
    """Create an AbbreviationResolver (see its docstring for the settings)."""
    return AbbreviationResolver(
        nlp.vocab, name, detector=detector, propagate=propagate, expand_undefined_uppercase=expand_undefined_uppercase
    )


class ClinicalAbbreviations(Pipe):
    """Expand the clinical abbreviations a doc does not define, and make entities of them.

    After `abbreviation_resolver` (whose `doc._.abbreviations` tell which short forms the doc defines; without
    it they are found here), for each short form of `CLINICAL_ABBREVIATIONS` and of your `abbreviations` that the
    doc does not define, and each occurrence of it (also with a plural "s") on token boundaries that overlaps no
    definition: an entity without a long form that holds occurrences gets `span._.long_form` ("CHF exacerbation"
    -> "congestive heart failure exacerbation"); an occurrence that no entity overlaps becomes an entity, its long
    form the listed one.
    """

    def __init__(
        self,
        vocab: Vocab,
        name: str = "clinical_abbreviations",
        *,
        label: str = "Disease",
        abbreviations: dict[str, str | None] | None = None,
    ) -> None:
        """Initialize the component.

        vocab (Vocab): The shared vocabulary.
        name (str): The component instance name.
        label (str): The label of the entities it adds.
        abbreviations (Optional[Dict[str, Optional[str]]]): Your own short forms and their long forms, added to
            `CLINICAL_ABBREVIATIONS` (one of its short forms given here takes the long form given; None leaves it
            out), e.g. {"COPD": "chronic obstructive pulmonary disease", "MI": None}.
        """
        abbreviations = dict(abbreviations or {})
        for short, long in abbreviations.items():
            if not (isinstance(short, str) and short.strip()) or not (long is None or isinstance(long, str)):
                expected = "a mapping of short forms to long forms (text, or null to leave one out)"
                raise ConceptNormError(
                    Errors.E410.format(component=name, key="abbreviations", expected=expected, value={short: long})
                )
        self.vocab = vocab
        self.name = name
        self.label = label
        self.abbreviations = abbreviations
        self.long_forms = {
            short: long for short, long in {**CLINICAL_ABBREVIATIONS, **abbreviations}.items() if long is not None
        }

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a doc.

        doc (Doc): The document, with its entities set.
        RETURNS (Doc): The same doc, with the entities added and `ent._.long_form` set.
        """
        found = doc._.abbreviations
        text = doc.text  # spaCy joins the tokens' texts anew at each `doc.text`
        defined = [Abbreviation(**a) for a in found] if found is not None else find_abbreviations(text)
        shorts = {abbreviation.short for abbreviation in defined}
        taken = [(a.short_start, a.short_end) for a in defined] + [(a.long_start, a.long_end) for a in defined]
        known = {short: long for short, long in self.long_forms.items() if short not in shorts}
        occurrences = _without_overlaps(
            [o for o in _find(doc, text, known) if not any(o[0] < end and start < o[1] for start, end in taken)]
        )
        if not occurrences:
            return doc
        ents = list(doc.ents)
        for ent in ents:
            if not ent._.long_form:
                long_form = _expand(ent, text, occurrences)
                if long_form is not None:
                    ent._.long_form = long_form
        added = [
            (doc.char_span(start, end, label=self.label), long_form)
            for start, end, long_form in occurrences
            if not any(start < ent.end_char and ent.start_char < end for ent in ents)
        ]
        if added:
            doc.ents = sorted(ents + [span for span, _ in added])
            for span, long_form in added:
                span._.long_form = long_form
        return doc


@Language.factory(
    "clinical_abbreviations",
    assigns=["doc.ents", "span._.long_form"],
    default_config={"label": "Disease", "abbreviations": {}},
)
def make_clinical_abbreviations(
    nlp: Language, name: str, label: str, abbreviations: dict[str, str | None]
) -> ClinicalAbbreviations:
    """Create a ClinicalAbbreviations component (see its docstring for the settings)."""
    return ClinicalAbbreviations(nlp.vocab, name, label=label, abbreviations=abbreviations)


def _find(doc: Doc, text: str, long_forms: dict[str, Abbreviation | str]) -> list[Occurrence]:
    """Each occurrence of the short forms (the keys of `long_forms`), also with a plural "s", that starts and ends
    on token boundaries, in text order (of two short forms at the same place, the longer); `text` is the doc's."""
    if not long_forms:
        return []
    shorts = "|".join(re.escape(short) for short in sorted(long_forms, key=len, reverse=True))
    return [
        (match.start(), match.end(), long_forms[match.group(1)])
        for match in re.finditer(rf"(?<!\w)({shorts})s?(?!\w)", text)
        if doc.char_span(match.start(), match.end()) is not None
    ]


def _without_overlaps(found: list[Occurrence]) -> list[Occurrence]:
    """The occurrences in text order, one that overlaps an earlier one dropped (of two at the same start, the
    longer is kept)."""
    kept: list[Occurrence] = []
    for occurrence in sorted(found, key=lambda o: (o[0], -o[1])):
        if not kept or occurrence[0] >= kept[-1][1]:
            kept.append(occurrence)
    return kept


def _expand(ent: Span, text: str, occurrences: Iterable[Occurrence]) -> str | None:
    """The entity text with each short form occurrence inside it replaced by its long form, or None if there is
    none (`text`: the doc's). An entity that holds a whole definition ("long form (SF)") keeps that short form as
    it is."""
    parts = []
    position = ent.start_char
    for start, end, abbreviation in occurrences:
        inside = ent.start_char <= start and end <= ent.end_char
        if isinstance(abbreviation, str):  # a clinical abbreviation's listed long form
            long, holds_definition = abbreviation, False
        else:
            long = abbreviation.long
            holds_definition = ent.start_char <= abbreviation.long_start and abbreviation.long_end <= ent.end_char
        if inside and not holds_definition:
            parts.extend((text[position:start], long))
            position = end
    if not parts:
        return None
    return "".join(parts) + text[position : ent.end_char]


def _is_uppercase_abbreviation(text: str) -> bool:
    """Whether an entity text looks like an undefined abbreviation: one word, a valid short form, all capitals."""
    return is_short_form(text) and text.isupper() and not any(c.isspace() for c in text)
