"""Normalization shared by knowledge-base names and mention queries.

The same `TextNormalizer` must be applied to both sides: the index stores one vector per *normalized* name, so a
mention whose normalized text equals a name reuses that name's vector without running the encoder.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass

from ..errors import ConceptNormError, Errors

_PUNCT = re.compile(r"[^\w\s]|_")
_SPACE = re.compile(r"\s+")
UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


@dataclass(frozen=True)
class TextNormalizer:
    """Map a name or mention to the key under which it is stored and searched.

    lowercase (bool): Case-fold the text.
    strip_accents (bool): Drop combining marks after NFKD decomposition ("Sjögren" -> "Sjogren").
    strip_punctuation (bool): Replace punctuation with spaces ("Colorectal Neoplasms, Hereditary" -> words only).
    unicode_form (str): Unicode normalization form applied first ("NFKC" folds full-width and ligature forms).
    """

    lowercase: bool = True
    strip_accents: bool = True
    strip_punctuation: bool = True
    unicode_form: str = "NFKC"

    def __post_init__(self) -> None:
        if self.unicode_form not in UNICODE_FORMS:
            raise ConceptNormError(Errors.E009.format(choices=UNICODE_FORMS, value=self.unicode_form))

    def __call__(self, text: str) -> str:
        if not text.isascii():  # ASCII is unchanged by every Unicode form and has no combining marks
            text = unicodedata.normalize(self.unicode_form, text)
            if self.strip_accents:
                text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
        if self.lowercase:
            text = text.casefold()
        if self.strip_punctuation:
            text = _PUNCT.sub(" ", text)
        return _SPACE.sub(" ", text).strip()

    def to_dict(self) -> dict:
        return asdict(self)
