"""The recognizer's thresholds on the linker's confidence, set on dev: `link_filter`'s `min_confidence` and
`min_confidence_dictionary`.

The `link_filter` component drops entities whose calibrated `kb_confidence` is below its `min_confidence`, or below
`min_confidence_dictionary` for the entities the `dictionary_matcher` added. The best values depend on the
confidence model, which `calibrate` fits on dev, so `calibrate` then chooses them too: the pipeline runs on the dev
texts without the filter, and each pair of thresholds of `LINK_FILTER_GRID` is scored end to end on those docs; the
pair with the best sum of NER F1 and NER+linking F1, the two end-to-end headlines, is kept (ties: one threshold for
all entities, then the lower). 0.0 keeps every entity. NER+linking F1 alone is flat over a wide range of
thresholds while each step up costs NER F1, so it alone would choose a threshold that drops right entities. The
dictionary's entities get a threshold of their own, which scored better on dev than one for all (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable

from spacy.language import Language
from spacy.tokens import Doc, Span

from ..pipeline.link_filter import LinkFilter, dictionary_offsets
from .end_to_end import score_docs
from .gold import get_normalizer

LINK_FILTER_GRID = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)


def tune_link_filter(nlp: Language, dev_docs: list[Doc], grid: tuple[float, ...] = LINK_FILTER_GRID) -> dict:
    """Choose and set the thresholds of the pipeline's link_filter on dev (nothing without one).

    nlp (Language): The full pipeline (recognizer, dictionary_matcher, linker, link_filter).
    dev_docs (List[Doc]): Dev gold docs.
    grid (Tuple[float, ...]): The thresholds tried, for the recognizer's entities and for the dictionary's.
    RETURNS (dict): {"scores": {threshold: {"ner": prf, "ner_linking": prf}} with one threshold for all entities,
        "pairs": {"recognizer,dictionary": the same} for every pair, "min_confidence": the chosen threshold of the
        recognizer's entities, "min_confidence_dictionary": the dictionary's}; empty without a link_filter.
    """
    filters = [(name, pipe) for name, pipe in nlp.pipeline if isinstance(pipe, LinkFilter)]
    if not filters:
        return {}
    name, link_filter = filters[-1]
    kb = get_normalizer(nlp)[1].kb
    with nlp.select_pipes(disable=[n for n, _ in filters]):
        predicted = list(nlp.pipe(doc.text for doc in dev_docs))

    def keep(trial: LinkFilter) -> Callable[[Span], bool]:
        return lambda ent: trial.keeps(ent, (ent.start, ent.end) in dictionary_offsets(ent.doc, trial.spans_key))

    spans_key, exact = link_filter.spans_key, link_filter.keep_exact_names
    scores = {
        (t, d): score_docs(
            dev_docs,
            predicted,
            kb,
            keep=keep(
                LinkFilter(min_confidence=t, min_confidence_dictionary=d, spans_key=spans_key, keep_exact_names=exact)
            ),
        )
        for t in grid
        for d in grid
    }

    def merit(pair: tuple[float, float]) -> tuple:
        s = scores[pair]
        return round(s["ner"]["f"] + s["ner_linking"]["f"], 9), pair[0] == pair[1], -pair[0], -pair[1]

    best, dictionary = max(scores, key=merit)
    link_filter.min_confidence = float(best)
    link_filter.min_confidence_dictionary = float(dictionary)
    config = nlp.get_pipe_config(name)  # the object `nlp.config` is built from
    config["min_confidence"], config["min_confidence_dictionary"] = float(best), float(dictionary)

    def figures(pair: tuple[float, float]) -> dict:
        return {k: scores[pair][k] for k in ("ner", "ner_linking")}

    return {
        "scores": {str(t): figures((t, t)) for t in grid},
        "pairs": {f"{t},{d}": figures((t, d)) for t, d in scores},
        "min_confidence": best,
        "min_confidence_dictionary": dictionary,
    }
