"""Drop the entities that link nowhere: the `link_filter` component, after `concept_normalizer`.

A span that the recognizer (or the dictionary) takes for a disease but that the linker cannot tie to a concept
with confidence is more often a false entity than a true one out of the KB. `link_filter` removes from `doc.ents`
every entity whose calibrated `ent._.kb_confidence` is below `min_confidence` (and, with `drop_nil`, every entity
linked to NIL). Entities the linker did not look at (no confidence set) stay. The threshold is chosen on dev.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc, Span

from ..errors import ConceptNormError, Errors

NIL = "NIL"


class LinkFilter:
    """Remove the entities the linker is not confident about (see the module docstring)."""

    def __init__(self, name: str = "link_filter", *, min_confidence: float = 0.0, drop_nil: bool = False) -> None:
        """Initialize the component.

        name (str): The component's name.
        min_confidence (float): Entities whose `kb_confidence` is below this are dropped.
        drop_nil (bool): Also drop the entities linked to NIL.
        """
        if not 0.0 <= min_confidence <= 1.0:
            raise ConceptNormError(
                Errors.E410.format(component=name, key="min_confidence", expected="in [0, 1]", value=min_confidence)
            )
        self.name = name
        self.min_confidence = min_confidence
        self.drop_nil = drop_nil

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a linked doc.

        doc (Doc): The document, with `concept_normalizer` applied.
        RETURNS (Doc): The same doc, its unconfident entities removed.
        """
        kept = [ent for ent in doc.ents if self.keeps(ent)]
        if len(kept) < len(doc.ents):
            doc.ents = kept
        return doc

    def keeps(self, ent: Span) -> bool:
        """Whether an entity stays."""
        confidence = ent._.kb_confidence if Span.has_extension("kb_confidence") else None
        if self.drop_nil and ent.kb_id_ == NIL:
            return False
        return confidence is None or confidence >= self.min_confidence

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Nothing to save: the settings are in the pipeline's config."""

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> LinkFilter:
        """Nothing to load: the settings are in the pipeline's config."""
        return self


@Language.factory(
    "link_filter",
    requires=["doc.ents"],
    assigns=["doc.ents"],
    default_config={"min_confidence": 0.0, "drop_nil": False},
)
def make_link_filter(nlp: Language, name: str, min_confidence: float, drop_nil: bool) -> LinkFilter:
    """Create a LinkFilter (see its docstring for the settings)."""
    return LinkFilter(name, min_confidence=min_confidence, drop_nil=drop_nil)
