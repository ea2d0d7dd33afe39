"""spacy_conceptnorm: link biomedical and clinical entities in spaCy to ontology concepts."""

# ruff: noqa: E402 (the wait policy is set before the imports below load torch)
from .threads import passive_openmp_by_default

passive_openmp_by_default()  # before anything loads torch: see spacy_conceptnorm.threads

from .about import __version__
from .component import ConceptNormalizer, make_concept_normalizer
from .encoder import NameEncoder
from .index import VectorIndex
from .kb import Concept, KnowledgeBase, load_kb
from .pipeline_io import load, save
from .search import ALL_STRATEGIES, Match, SieveSearcher, parse_strategy
from .text.normalize import TextNormalizer

__all__ = [
    "ALL_STRATEGIES",
    "Concept",
    "ConceptNormalizer",
    "KnowledgeBase",
    "Match",
    "NameEncoder",
    "SieveSearcher",
    "TextNormalizer",
    "VectorIndex",
    "__version__",
    "load",
    "load_kb",
    "make_concept_normalizer",
    "parse_strategy",
    "save",
]
