"""Abbreviation detection: find the short forms a text defines, and where it defines them.

A definition is a long form with its short form in parentheses, "hereditary nonpolyposis colorectal cancer (HNPCC)",
or the reverse, "FAP (familial adenomatous polyposis)". Two detectors: a plain-Python Schwartz & Hearst (2003)
algorithm, and Ab3P (Sohn et al. 2008) through the optional `pyab3p` package. Both read a plain string and give
`Abbreviation`s with character offsets into it, so they hold no spaCy types: the `abbreviation_resolver` and
`clinical_abbreviations` components (in `pipeline`) map them onto a doc's tokens and entities.
"""

import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Errors


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
def load_ab3p() -> Any:
    """The process's Ab3P instance, created on first use (never stored on a component, so nothing unpicklable is).

    RETURNS (pyab3p.Ab3p): The instance. Raises ImportError when the `pyab3p` package is missing.
    """
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
    for result in load_ab3p().get_abbrs(squeezed):
        short_start, short_end = span(result.short_form_offset, len(result.short_form))
        long_start, long_end = span(result.long_form_offset, len(result.long_form))
        short, long = text[short_start:short_end], text[long_start:long_end]
        # Ab3P's offsets are sometimes off (e.g. when a sentence repeats): keep only results found where it says.
        if short == result.short_form and " ".join(long.split()) == result.long_form:
            found.append(Abbreviation(short, long, short_start, short_end, long_start, long_end))
    return sorted(found, key=lambda a: a.short_start)


# The detectors by the name the `abbreviation_resolver`'s `detector` setting gives them.
DETECTORS: dict[str, Callable[[str], list[Abbreviation]]] = {
    "schwartz_hearst": find_abbreviations,
    "ab3p": find_abbreviations_ab3p,
}
