"""Abbreviation resolution: expand the short forms a doc defines on its entities.

A definition is a long form with its short form in parentheses, "hereditary nonpolyposis colorectal cancer (HNPCC)",
or the reverse, "FAP (familial adenomatous polyposis)". The `abbreviation_resolver` component finds the
definitions of each doc, records them in `doc._.abbreviations` and sets `span._.long_form` on every entity that is,
or contains as whole tokens, a defined short form, so that a later component can link "HNPCC" through
"hereditary nonpolyposis colorectal cancer".

The detectors, a plain-Python Schwartz & Hearst (2003) algorithm and Ab3P (Sohn et al. 2008) through the optional
`pyab3p` package, read plain strings and live in `text.abbreviations`; this module maps what they find onto the
doc's tokens and entities. The `clinical_abbreviations` component expands, with the same helpers, the clinical
abbreviations a doc does not define.
"""

import re
from collections.abc import Iterable

from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors
from ..text.abbreviations import DETECTORS, Abbreviation, is_short_form, load_ab3p

if not Doc.has_extension("abbreviations"):
    Doc.set_extension("abbreviations", default=None)
if not Span.has_extension("long_form"):
    Span.set_extension("long_form", default=None)

# A short form's occurrence: its start and end character offsets, and its definition in the text or, for a
# clinical abbreviation the text does not define, its listed long form.
Occurrence = tuple[int, int, Abbreviation | str]


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
            load_ab3p()  # fail now, not on the first doc, when pyab3p is missing
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
            long_form = expand_short_form(ent, text, occurrences)
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
            found = find_occurrences(doc, text, first)
        else:
            found = [(a.short_start, a.short_end, a) for a in first.values()]
        return without_overlaps(found)


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


def find_occurrences(doc: Doc, text: str, long_forms: dict[str, Abbreviation | str]) -> list[Occurrence]:
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


def without_overlaps(found: list[Occurrence]) -> list[Occurrence]:
    """The occurrences in text order, one that overlaps an earlier one dropped (of two at the same start, the
    longer is kept)."""
    kept: list[Occurrence] = []
    for occurrence in sorted(found, key=lambda o: (o[0], -o[1])):
        if not kept or occurrence[0] >= kept[-1][1]:
            kept.append(occurrence)
    return kept


def expand_short_form(ent: Span, text: str, occurrences: Iterable[Occurrence]) -> str | None:
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
