"""Drop the entities that link nowhere: the `link_filter` component, after `concept_normalizer`.

A span that the recognizer (or the dictionary) takes for a disease but that the linker cannot tie to a concept
with confidence is more often a false entity than a true one out of the KB. `link_filter` removes from `doc.ents`
every entity whose calibrated `ent._.kb_confidence` is below `min_confidence` (and, with `drop_nil`, every entity
linked to NIL). Entities the linker did not look at (no confidence set) stay. The entities that the
`dictionary_matcher` added (its `doc.spans["dictionary"]`) can be held to a threshold of their own,
`min_confidence_dictionary`: a KB name found in the text is a disease less often than a span the recognizer
chose. Both thresholds are chosen on dev (`calibrate`).

On clinical notes a KB name found in the text is a condition far more often than in abstracts, and a confidence
calibrated on abstracts drops many ("pleural effusions", "hypothyroidism"). With `keep_exact_names`, a
dictionary entity linked to a concept of which its text is a name is held to `min_confidence` only. A short
all-capitals token without a long form ("HPI", "RA", "EXT": note shorthand that happens to name a rare disease)
is not an exact name here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import srsly
from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import ensure_path

from ..errors import ConceptNormError, Errors
from ..io.files import write_json

NIL = "NIL"
CFG_FILE = "cfg"


class LinkFilter:
    """Remove the entities the linker is not confident about (see the module docstring)."""

    def __init__(
        self,
        name: str = "link_filter",
        *,
        min_confidence: float = 0.0,
        drop_nil: bool = False,
        min_confidence_dictionary: float | None = None,
        spans_key: str = "dictionary",
        keep_exact_names: bool = False,
    ) -> None:
        """Initialize the component.

        name (str): The component's name.
        min_confidence (float): Entities whose `kb_confidence` is below this are dropped.
        drop_nil (bool): Also drop the entities linked to NIL.
        min_confidence_dictionary (Optional[float]): The threshold of the entities in `doc.spans[spans_key]` (those
            the dictionary_matcher added); None: `min_confidence`, as for every entity.
        spans_key (str): The `doc.spans` key of the dictionary's entities.
        keep_exact_names (bool): Hold the dictionary's entities that are exact names of their concept (see the
            module docstring) to `min_confidence`.
        """
        check_confidence(name, "min_confidence", min_confidence)
        check_confidence(name, "min_confidence_dictionary", min_confidence_dictionary)
        self.name = name
        self.min_confidence = min_confidence
        self.drop_nil = drop_nil
        self.min_confidence_dictionary = min_confidence_dictionary
        self.spans_key = spans_key
        self.keep_exact_names = keep_exact_names

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a linked doc.

        doc (Doc): The document, with `concept_normalizer` applied.
        RETURNS (Doc): The same doc, its unconfident entities removed.
        """
        added = dictionary_offsets(doc, self.spans_key)
        kept = [ent for ent in doc.ents if self.keeps(ent, (ent.start, ent.end) in added)]
        if len(kept) < len(doc.ents):
            doc.ents = kept
        return doc

    def keeps(self, ent: Span, from_dictionary: bool = False) -> bool:
        """Whether an entity stays (`from_dictionary`: the dictionary_matcher added it)."""
        confidence = ent._.kb_confidence if Span.has_extension("kb_confidence") else None
        if self.drop_nil and ent.kb_id_ == NIL:
            return False
        threshold = self.min_confidence
        if from_dictionary and self.min_confidence_dictionary is not None:
            if not (self.keep_exact_names and is_exact_name(ent)):
                threshold = self.min_confidence_dictionary
        return confidence is None or confidence >= threshold

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Save the settings (also in the pipeline's config) to `path`/cfg, atomically."""
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / CFG_FILE, self.settings())

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> LinkFilter:
        """Load the settings `to_disk` saved."""
        file = ensure_path(path) / CFG_FILE
        if not file.exists():
            raise ConceptNormError(Errors.E412.format(path=file, detail="file not found"))
        try:
            data = srsly.read_json(file)
        except ValueError as e:
            raise ConceptNormError(Errors.E412.format(path=file, detail=e)) from None
        return self._set_settings(data, file)

    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        """The settings as a bytestring."""
        return srsly.json_dumps(self.settings()).encode("utf8")

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = ()) -> LinkFilter:
        """Load the settings `to_bytes` gave."""
        try:
            data = srsly.json_loads(bytes_data)
        except ValueError as e:
            raise ConceptNormError(Errors.E412.format(path="the bytes given", detail=e)) from None
        return self._set_settings(data, "the bytes given")

    def settings(self) -> dict:
        """The component's settings, as its factory takes them."""
        return {
            "min_confidence": self.min_confidence,
            "drop_nil": self.drop_nil,
            "min_confidence_dictionary": self.min_confidence_dictionary,
            "spans_key": self.spans_key,
            "keep_exact_names": self.keep_exact_names,
        }

    def _set_settings(self, data: object, source: object) -> LinkFilter:
        keys = set(self.settings())
        # a pipeline saved before keep_exact_names existed lacks that key
        if not isinstance(data, dict) or not keys - {"keep_exact_names"} <= set(data) <= keys:
            raise ConceptNormError(
                Errors.E412.format(path=source, detail=f"expected the keys {sorted(self.settings())}")
            )
        try:
            loaded = LinkFilter(self.name, **data)
        except (ConceptNormError, TypeError) as e:
            raise ConceptNormError(Errors.E412.format(path=source, detail=e)) from None
        self.__dict__.update(loaded.__dict__)
        return self


def check_confidence(component: str, key: str, value: float | None) -> None:
    """Raise E410 unless a threshold setting `key` of `component` is None or in [0, 1]."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConceptNormError(Errors.E410.format(component=component, key=key, expected="in [0, 1]", value=value))


def is_exact_name(ent: Span) -> bool:
    """Whether the linked entity's text (or its long form, where the linker searched that) is a name of the concept
    it is linked to: the linker's top candidate is that concept with a cosine of exactly 1, which a query equal to
    a known name gets (it reuses the name's vector). A short all-capitals token without a long form is not."""
    candidates = ent._.kb_ents if Span.has_extension("kb_ents") else None
    if not candidates or candidates[0][0] != ent.kb_id_ or candidates[0][1] < 1.0:
        return False
    long_form = ent._.long_form if Span.has_extension("long_form") else None
    return bool(long_form) or not (len(ent) == 1 and len(ent.text) <= 4 and not any(c.islower() for c in ent.text))


def dictionary_offsets(doc: Doc, spans_key: str) -> set[tuple[int, int]]:
    """The (start, end) token offsets of the entities the dictionary_matcher added to `doc` (none without a record)."""
    return {(span.start, span.end) for span in doc.spans[spans_key]} if spans_key in doc.spans else set()


@Language.factory(
    "link_filter",
    requires=["doc.ents"],
    assigns=["doc.ents"],
    default_config={
        "min_confidence": 0.0,
        "drop_nil": False,
        "min_confidence_dictionary": None,
        "spans_key": "dictionary",
        "keep_exact_names": False,
    },
)
def make_link_filter(
    nlp: Language,
    name: str,
    min_confidence: float,
    drop_nil: bool,
    min_confidence_dictionary: float | None,
    spans_key: str,
    keep_exact_names: bool,
) -> LinkFilter:
    """Create a LinkFilter (see its docstring for the settings)."""
    return LinkFilter(
        name,
        min_confidence=min_confidence,
        drop_nil=drop_nil,
        min_confidence_dictionary=min_confidence_dictionary,
        spans_key=spans_key,
        keep_exact_names=keep_exact_names,
    )
