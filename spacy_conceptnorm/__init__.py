"""spacy_conceptnorm: link biomedical and clinical entities in spaCy to ontology concepts.

The public names below are imported from their modules when first read, so that importing the package (or one of
its modules, which imports the package first) loads nothing it does not use; spaCy finds the components through
the package's entry points (setup.cfg), which import the modules that register them.
"""

from importlib import import_module

from .ml.threads import passive_openmp_by_default

passive_openmp_by_default()  # before anything loads torch: see spacy_conceptnorm.ml.threads

from .about import __version__ as __version__  # noqa: E402

_MODULES = {
    "ALL_STRATEGIES": "search.sieve",
    "Concept": "kb.concept",
    "ConceptNormalizer": "pipeline.concept_normalizer",
    "KnowledgeBase": "kb.knowledge_base",
    "Match": "search.sieve",
    "NameEncoder": "ml.name_encoder",
    "SieveSearcher": "search.sieve",
    "TextNormalizer": "text.normalize",
    "VectorIndex": "search.index",
    "load": "io.pipelines",
    "load_kb": "kb.knowledge_base",
    "make_concept_normalizer": "pipeline.concept_normalizer",
    "parse_strategy": "search.sieve",
    "save": "io.pipelines",
}

__all__ = [*_MODULES, "__version__"]


def __getattr__(name: str):
    """A public name, imported from its module on first use (then kept in the package's namespace)."""
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_MODULES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})
