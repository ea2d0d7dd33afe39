"""A concept of an ontology: what a file-format reader (`formats`) yields and the knowledge base
(`knowledge_base`) stores."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Concept:
    """A concept of the ontology.

    concept_id (str): The id, as the ontology writes it.
    canonical_name (str): The preferred name.
    alt_ids (tuple): Other ids of the same concept (e.g. OMIM ids of a MEDIC concept); a gold id matches the
        concept when it is any of its ids.
    parents (tuple): Ids of the parent concepts.
    definition (str): A definition, if the ontology gives one.
    types (tuple): Semantic types or categories.
    """

    concept_id: str
    canonical_name: str
    alt_ids: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    definition: str = ""
    types: tuple[str, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.concept_id, *self.alt_ids)
