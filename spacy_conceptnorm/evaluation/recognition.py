"""The recognizer's threshold on the linker's confidence, set on dev: `link_filter`'s `min_confidence`.

The `link_filter` component drops entities whose calibrated `kb_confidence` is below its `min_confidence`. The
best value depends on the confidence model, which `calibrate` fits on dev, so `calibrate` then chooses it too: the
pipeline runs on the dev texts without the filter, and each threshold of `LINK_FILTER_GRID` is scored end to end
on those docs; the one with the best sum of NER F1 and NER+linking F1, the two end-to-end headlines, is kept (ties:
the lower). 0.0 keeps every entity. (NER+linking F1 alone is flat over a wide range of thresholds, within 0.3
points on NCBI-disease dev from 0.5 to 0.8, while each step up costs NER F1: 84.69 at 0.5, 82.45 at 0.8; taking
the highest NER+linking F1 alone chose 0.8 there.)
"""

from __future__ import annotations

from spacy.language import Language
from spacy.tokens import Doc

from ..text.link_filter import LinkFilter
from .end_to_end import score_docs
from .gold import get_normalizer

LINK_FILTER_GRID = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)


def tune_link_filter(nlp: Language, dev_docs: list[Doc], grid: tuple[float, ...] = LINK_FILTER_GRID) -> dict:
    """Choose and set the `min_confidence` of the pipeline's link_filter on dev (nothing without one).

    nlp (Language): The full pipeline (recognizer, linker, link_filter).
    dev_docs (List[Doc]): Dev gold docs.
    grid (Tuple[float, ...]): The thresholds tried.
    RETURNS (dict): {"scores": {threshold: {"ner": prf, "ner_linking": prf}}, "min_confidence": the chosen one};
        empty without a link_filter.
    """
    filters = [(name, pipe) for name, pipe in nlp.pipeline if isinstance(pipe, LinkFilter)]
    if not filters:
        return {}
    name, link_filter = filters[-1]
    kb = get_normalizer(nlp)[1].kb
    with nlp.select_pipes(disable=[n for n, _ in filters]):
        predicted = list(nlp.pipe(doc.text for doc in dev_docs))
    scores = {}
    for threshold in grid:

        def keep(ent, threshold=threshold):
            return ent._.kb_confidence is None or ent._.kb_confidence >= threshold

        scores[threshold] = score_docs(dev_docs, predicted, kb, keep=keep)
    best = max(grid, key=lambda t: (round(scores[t]["ner"]["f"] + scores[t]["ner_linking"]["f"], 9), -t))
    link_filter.min_confidence = float(best)
    nlp.get_pipe_config(name)["min_confidence"] = float(best)  # the object `nlp.config` is built from
    return {
        "scores": {str(t): {k: s[k] for k in ("ner", "ner_linking")} for t, s in scores.items()},
        "min_confidence": best,
    }
