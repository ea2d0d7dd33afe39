"""The knowledge base: concepts, their names and links, read from an ontology file (MEDIC, CTD, OBO, MRCONSO,
JSONL) and saved in a compact form that loads without a parse."""

from .concept import Concept
from .knowledge_base import DOMAIN, ONTOLOGY, SOURCE_BITS, KnowledgeBase, load_kb

__all__ = ["DOMAIN", "ONTOLOGY", "SOURCE_BITS", "Concept", "KnowledgeBase", "load_kb"]
