"""Split composite entity mentions ("breast and ovarian cancer") into the mentions they coordinate.

A composite mention names several concepts at once: "breast and ovarian cancer" is "breast cancer" plus
"ovarian cancer", and the NCBI-disease corpus links its 170 `CompositeMention`s to `|`-joined concept ids.
A name encoder cannot embed such a mention close to either concept, so linkers rewrite it first, with simple
rules as in D'Souza & Ng (2015) and Phan et al. (2019, 4.3). Clinical-trial interventions coordinate drugs
("ribociclib plus letrozole"), which Miftahutdinov et al. (2021, 5.1) split on a few cue words.

`split_composite` does the rewriting on a plain string, so it holds no spaCy types; the `composite_splitter`
component (`pipeline.composite_splitter`) stores the parts of each entity as `span._.composite_parts` and leaves
`doc.ents` and the tokens untouched.

The rules, in the order they are tried:

1. A known or protected name is never split ("hand, foot and mouth disease").
2. Interventions (`split_interventions`): "A plus B", "A + B", "A vs B", "A versus B", "A in combination
   with B", "combination of A and B" -> "A", "B".
3. A coordination inside a final parenthesis: "complement deficiencies (C2 and C7)".
4. Head first, the conjuncts after a preposition: "cancer of the breast and ovary" -> "cancer of the breast",
   "cancer of the ovary".
5. Shared modifiers and head: "A, B, and C tumors" -> "A tumors", "B tumors", "C tumors";
   "type 1 and type 2 diabetes"; "hereditary breast and ovarian cancer" -> "hereditary breast cancer",
   "hereditary ovarian cancer"; "cleft lip/palate" -> "cleft lip", "cleft palate".

Parts are split again, up to three times ("aplasia or hypoplasia of the thymus and parathyroid glands" gives
four parts). A shared head is kept as written, plural included: "colorectal and ovarian cancers" gives
"colorectal cancers" and "ovarian cancers"; singularizing would be a guess ("metastases", "AIDS"), so plural
forms are left to the linker. Hyphens never split ("Smith-Lemli-Opitz syndrome", "breast-ovarian cancer").

Where the extent of a shared head is ambiguous ("bone and soft tissue tumors": "bone tissue tumors" or "bone
tumors"?) the rules prefer a one-word last conjunct; given `is_known_name`, the first reading whose parts are
all known names wins instead.
"""

import functools
import re
from collections.abc import Callable, Iterable

from ..errors import ConceptNormError, Errors

# Disease names that contain a conjunction but name one concept. Matched inside mentions, case-insensitively.
DEFAULT_PROTECTED = (
    "hand, foot and mouth disease",
    "foot and mouth disease",
    "graft versus host",
    "host versus graft",
    "Jervell and Lange-Nielsen syndrome",
)

Part = list[str]  # one mention, as units (see `_units`)
Reading = list[Part]  # one way to split a mention

_CONJUNCTIONS = {"and", "or", "and/or", "/"}
_PREPOSITIONS = {"of", "in", "to", "on"}
_DETERMINERS = {"the", "a", "an", "some"}
_MAX_DEPTH = 3  # parts are split again at most this many times
_MAX_SIZES = 4  # readings tried per end of the words after a conjunction (the shared head is short)
MAX_CHARS = 1000  # longer mentions are not split (the linker cuts mentions at 1000 characters too)

# A unit is a word, a comma, or a whole parenthesised group, so "(BZS)" or "(C2 and C7)" is one unit and a
# conjunction inside parentheses never splits the mention around it.
_UNIT = re.compile(r"\([^()]*\)|,|[^\s,()]+|[()]")
# One side of "X/Y" that may be split: a word of two or more characters starting with a letter. "3/4",
# "Na+/K+" and "w/o" stay whole.
_SLASH_SIDE = re.compile(r"[A-Za-z][A-Za-z0-9-]+")
# A conjunct that is an identifier rather than a word: "2", "III", "B", "C7", "FOXC2". In "spinocerebellar
# ataxias 1 and 2" or "haemophilia A and B" it completes the words before its partner.
_IDENTIFIER = re.compile(r"[IVX]+|[A-Z]|\w*\d\w*")
# "complement deficiencies (C2 and C7)": a head followed by a parenthesised coordination.
_PAREN_COORDINATION = re.compile(r"(?P<head>[^()]+?)\s*\((?P<inner>[^()]+)\)")

# Clinical-trial interventions (Miftahutdinov et al. 2021, 5.1). A cue must be present before "and", "or" and
# commas also split the mention into drugs with no shared words. "+" counts only between spaces ("CD4+").
_INTERVENTION_CUE = re.compile(
    r"\s(?:\+|plus|vs\.?|versus)\s|\bcombin(?:ation|ed|e)\s+(?:of|with)\b|\bin\s+combination\b", re.IGNORECASE
)
_INTERVENTION_LEAD = re.compile(r"^(?:(?:a|the)\s+)?combination\s+(?:therapy\s+)?(?:of|with)\s+", re.IGNORECASE)
_INTERVENTION_SEP = re.compile(
    r"\s+(?:\+|plus|vs\.?|versus|(?:in\s+)?combination\s+with|combined?\s+with|and/or|and|or)\s+|\s*[,;]\s*",
    re.IGNORECASE,
)

# Protected names are swapped for placeholders in these private-use characters while the rules run.
_MASK = re.compile("\ue000(\\d+)\ue001")


def split_composite(
    text: str,
    *,
    protected: Iterable[str] = DEFAULT_PROTECTED,
    is_known_name: Callable[[str], bool] | None = None,
    split_interventions: bool = True,
) -> list[str]:
    """Split a composite mention into the mentions it coordinates, in text order.

    text (str): The mention, e.g. "breast and ovarian cancer".
    protected (Iterable[str]): Names never split, also where they occur inside the mention (case-insensitive).
    is_known_name (Optional[Callable[[str], bool]]): Tells whether a text is a name of the knowledge base. A
        known name is not split, and a reading whose parts are all known names is preferred.
    split_interventions (bool): Also split drug combinations ("A plus B", "A vs B", "A + B").
    RETURNS (List[str]): The parts, e.g. ["breast cancer", "ovarian cancer"]; `[text]` if there is nothing to
        split.
    """
    if not isinstance(text, str):
        raise ConceptNormError(Errors.E504.format(value=text))
    if isinstance(protected, str):
        raise ConceptNormError(Errors.E501.format(key="protected", value=protected))
    pattern = _protected_pattern(tuple(protected))
    if len(text) > MAX_CHARS:  # not a name; and its parts would grow with the square of its length
        return [text]
    parts = _split(" ".join(text.split()), pattern, is_known_name, split_interventions, depth=0)
    return parts if len(parts) >= 2 else [text]


def _split(
    text: str,
    protected: re.Pattern,
    is_known_name: Callable[[str], bool] | None,
    split_interventions: bool,
    depth: int,
) -> list[str]:
    if not text or (is_known_name is not None and is_known_name(text)):
        return [text]
    masked, saved = _mask(text, protected)
    parts = None
    if split_interventions and _INTERVENTION_CUE.search(masked):
        parts = _split_intervention(masked)
    if not parts:
        parts = _split_coordination(masked, is_known_name)
    parts = [_unmask(part, saved) for part in parts]
    if len(parts) < 2 or text in parts:
        return [text]
    if depth >= _MAX_DEPTH:
        return parts
    return [sub for part in parts for sub in _split(part, protected, is_known_name, split_interventions, depth + 1)]


def _split_intervention(text: str) -> list[str]:
    """Split "combination of A and B", "A plus B", "A vs. B" into "A", "B": drugs share no words."""
    text = _INTERVENTION_LEAD.sub("", text, count=1)
    return [part for part in _INTERVENTION_SEP.split(text) if part]


def _split_coordination(text: str, is_known_name: Callable[[str], bool] | None) -> list[str]:
    """Split one coordination of disease-like names (rules 3 to 5 of the module docstring)."""
    paren = _PAREN_COORDINATION.fullmatch(text)
    if paren and _last_conjunction(_units(paren["head"])) is None:
        inner = _split_coordination(paren["inner"], is_known_name)
        if len(inner) >= 2:
            return [f"{paren['head']} {part}" for part in inner]
    units = _units(text)
    conjunction = _last_conjunction(units)
    if conjunction is None:
        return [text]
    head_first = _head_before_preposition(units, conjunction)
    if head_first is not None:
        head, tail = head_first
        readings = [[head + part for part in reading] for reading in _readings(tail, complete_nps=True)]
    else:
        readings = _readings(units, complete_nps=False)
    # A hyphen left hanging means an unknown completion ("pre- and postoperative"): do not guess.
    readings = [r for r in readings if not any(unit.endswith("-") for part in r for unit in part)]
    if not readings:
        return [text]
    best = readings[0]
    if is_known_name is not None:
        # Trust the knowledge base only where all parts are names: counting known parts would favour readings
        # that drop modifiers ("familial retinoblastoma" is a name, "familial bilateral retinoblastoma" not).
        best = next((r for r in readings if all(is_known_name(_join(part)) for part in r)), best)
    return [_join(part) for part in best]


def _readings(units: list[str], complete_nps: bool) -> list[Reading]:
    """The ways to split `units` around its last conjunction, the preferred one first.

    complete_nps (bool): The conjuncts follow a preposition ("of the elbows, knees and spine") and are
        whole noun phrases: prefer splitting them as written over sharing words between them.
    """
    conjunction = _last_conjunction(units)
    if conjunction is None:
        return []
    segments = _segments(units[:conjunction])
    right = _drop_determiners(units[conjunction + 1 :])
    if not segments or not right:
        return []
    others, last = segments[:-1], segments[-1]
    if len(right) == 1:
        return _readings_without_head(others, last, right, complete_nps)
    return _readings_with_head(others, last, right, complete_nps)


def _readings_without_head(others: list[Part], last: Part, right: Part, complete_nps: bool) -> list[Reading]:
    """Nothing follows the last conjunct: "colorectal adenomas and carcinoma", "ataxias 1 and 2"."""
    if not others and len(last) >= 2:
        # The words before the left conjunct may be shared: "nonsyndromic cleft lip and palate" ->
        # "nonsyndromic cleft palate". Likely for lower-case words, but not for a proper name ("Wilms tumor and
        # aniridia"), nor inside noun phrases after a preposition unless the conjunct is an identifier
        # ("transcription factors FOXC1 and FOXC2").
        prefix = last[:-1]
        if _IDENTIFIER.fullmatch(right[0]) or (not complete_nps and _is_lower(prefix)):
            return [[last, prefix + right]]
    return [others + [last, right]]


def _readings_with_head(others: list[Part], last: Part, right: Part, complete_nps: bool) -> list[Reading]:
    """Words follow the last conjunct and may be a head shared by all conjuncts: "breast and ovarian cancer".

    There is one reading per length of the last conjunct ("bone and soft tissue tumors": "soft" or "soft
    tissue"), and one with no shared head.
    """
    as_written = others + [last, right]
    readings = [as_written] if complete_nps else []
    for size in _last_conjunct_sizes(last, right):
        final, head = right[:size], right[size:]
        if head[0] == ",":
            head = head[1:]  # "colorectal, or other, cancers"
        conjuncts = [_complete_suspended_hyphen(part, final) for part in others + [last]]
        if not others and len(last) > size and _is_lower(last[:-size]):
            # "hereditary breast and ovarian cancer": lower-case words before the left conjunct are shared,
            # not the words of a name ("Los Angeles and Duarte galactosemia").
            conjuncts.append(last[:-size] + final)
        else:
            conjuncts.append(final)
        readings.append([conjunct + head for conjunct in conjuncts])
    if not complete_nps:
        readings.append(as_written)
    return readings


def _last_conjunct_sizes(last: Part, right: Part) -> list[int]:
    """How many units of `right` the last conjunct may take (the rest is the shared head), preferred first."""
    if "," in right[1:-1]:
        return [right.index(",", 1)]  # "colorectal, or other, cancers": the comma ends the conjunct
    if last[-1].endswith("-"):
        # Suspended hyphen, "RCC- and von Hippel-Lindau disease-associated tumors": the conjunct ends with
        # the hyphenated word that completes "RCC-".
        hyphenated = [i for i, unit in enumerate(right[:-1]) if "-" in unit.strip("-")]
        if hyphenated:
            return [hyphenated[-1] + 1]
    preferred = 1
    if len(right) > len(last) >= 2 and any(a.lower() == b.lower() for a, b in zip(last, right, strict=False)):
        # Parallel conjuncts, "type 1 and type 2 diabetes", "subtotal C6 and complete C6 deficiency".
        preferred = len(last)
    # a short last conjunct or a short shared head: a bounded number of readings, so splitting stays linear
    sizes = range(1, len(right))
    sizes = [*sizes[:_MAX_SIZES], *sizes[_MAX_SIZES:][-_MAX_SIZES:]]
    return [preferred] + [size for size in sizes if size != preferred]


def _complete_suspended_hyphen(part: Part, final: Part) -> Part:
    """Complete a suspended hyphen: "BRCA1-" before "BRCA2-linked" is "BRCA1-linked"."""
    suffixes = [unit.rsplit("-", 1)[1] for unit in final if "-" in unit.strip("-")]
    if part[-1].endswith("-") and suffixes:
        return part[:-1] + [part[-1] + suffixes[-1]]
    return part


def _head_before_preposition(units: list[str], conjunction: int) -> tuple[Part, Part] | None:
    """Split "cancer of the breast and ovary" into the head "cancer of the" and the coordinated tail."""
    prepositions = [i for i in range(1, conjunction) if units[i].lower() in _PREPOSITIONS]
    if not prepositions:
        return None
    start = prepositions[-1] + 1
    if units[start].lower() in _DETERMINERS:
        start += 1
    if start >= conjunction:
        return None
    return units[:start], units[start:]


def _units(text: str) -> list[str]:
    """Words, commas and parenthesised groups; "X/Y" as "X", "/", "Y"; "non X" as one unit."""
    units: list[str] = []
    for token in _UNIT.findall(text):
        units.extend(_split_slash(token))
    glued: list[str] = []
    for unit in units:
        if glued and glued[-1].lower() == "non" and unit not in _CONJUNCTIONS and unit != ",":
            glued[-1] = f"{glued[-1]} {unit}"  # "hereditary and non hereditary retinoblastoma"
        else:
            glued.append(unit)
    return glued


def _split_slash(token: str) -> list[str]:
    """Split "lip/palate" into "lip", "/", "palate"; pairs of capitals ("DNA/RNA", "HIV/AIDS") name one thing."""
    sides = token.split("/")
    if len(sides) < 2 or token.lower() == "and/or" or not all(_SLASH_SIDE.fullmatch(side) for side in sides):
        return [token]
    if all(side.isalpha() and side.isupper() for side in sides):
        return [token]
    units = [sides[0]]
    for side in sides[1:]:
        units.extend(["/", side])
    return units


def _last_conjunction(units: list[str]) -> int | None:
    """The index of the last conjunction with something on both sides, or None."""
    for i in range(len(units) - 2, 0, -1):
        if units[i].lower() in _CONJUNCTIONS:
            return i
    return None


def _segments(units: list[str]) -> list[Part]:
    """The conjuncts left of the last conjunction, separated by commas and other conjunctions."""
    segments: list[Part] = [[]]
    for unit in units:
        if unit == "," or unit.lower() in _CONJUNCTIONS:
            segments.append([])
        else:
            segments[-1].append(unit)
    return [segment for segment in segments if segment]


def _drop_determiners(units: list[str]) -> list[str]:
    """Drop leading determiners, as in "retinal and the pineal tumours": they belong to neither conjunct."""
    while len(units) > 1 and units[0].lower() in _DETERMINERS:
        units = units[1:]
    return units


def _is_lower(units: Part) -> bool:
    return all(not unit[:1].isupper() for unit in units)


def _join(units: Part) -> str:
    return " ".join(units).replace(" ,", ",").replace("( ", "(").replace(" )", ")")


@functools.lru_cache(maxsize=32)
def _protected_pattern(names: tuple[str, ...]) -> re.Pattern:
    """One regex matching any protected name as whole words, longest first, spaces matching any spacing, and
    the placeholder characters."""
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConceptNormError(Errors.E501.format(key="protected", value=name))
    alternatives = [r"\s+".join(map(re.escape, name.split())) for name in sorted(names, key=len, reverse=True)]
    # the placeholder characters themselves are masked too, so that a mention holding them cannot fake one
    own = "[\ue000\ue001]"
    if not alternatives:
        return re.compile(own)
    return re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)|" + own, re.IGNORECASE)


def _mask(text: str, pattern: re.Pattern) -> tuple[str, list[str]]:
    """Replace each protected name (and placeholder character) in `text` with a placeholder the rules cannot
    split."""
    saved: list[str] = []

    def placeholder(match: re.Match) -> str:
        saved.append(match.group())
        return f"\ue000{len(saved) - 1}\ue001"

    return pattern.sub(placeholder, text), saved


def _unmask(text: str, saved: list[str]) -> str:
    return _MASK.sub(lambda match: saved[int(match.group(1))], text)
