"""Whether a small statistical model on top of `clinical_context`'s rules gets more statuses right on the whole
notes than the rules alone: a logistic regression over the rules' status, the cues' categories, the section and the
words of the sentence (and of the sentence before), in 5-fold cross-validation by note on the dev notes.

    python -m benchmarks.assertion_model [docs/clinical_notes/whole/dev.jsonl]

It prints, for each regularization strength, the model's accuracy and the rules' over the same folds.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import spacy
from sklearn.feature_extraction import DictVectorizer
from sklearn.linear_model import LogisticRegression
from spacy.tokens import Span

from spacy_conceptnorm.evaluation.assertion import asserted_entities, read_annotated_spans, spans_by_text

FOLDS = 5


def features(ent: Span) -> dict[str, int]:
    """The features of one entity, its status set by clinical_context."""
    doc, sent = ent.doc, ent.sent
    found = {f"rule={ent._.assertion}": 1, f"section={ent._.section_category}": 1}
    found.update({f"cue={m.category}": 1 for m in ent._.modifiers})
    found.update({f"left={t.lower_}": 1 for t in doc[sent.start : ent.start]})
    found.update({f"right={t.lower_}": 1 for t in doc[ent.end : sent.end]})
    if sent.start > 0:
        found.update({f"before={t.lower_}": 1 for t in doc[sent.start - 1].sent})
    return found


def rows(path: str, describe: Callable[[Span], Any] = features) -> list[tuple[int, Any, str, str]]:
    """(note, `describe` of the entity, gold status, the rules' status) of every annotated span of `path`."""
    nlp = spacy.blank("en")
    context = nlp.add_pipe("clinical_context").name
    found = []
    for note, (text, spans) in enumerate(spans_by_text(read_annotated_spans(path)).items()):
        for span, ent in zip(spans, asserted_entities(nlp, context, text, spans), strict=True):
            found.append((note, describe(ent), span.status, ent._.assertion))
    return found


def main(path: str = "docs/clinical_notes/whole/dev.jsonl") -> None:
    data = rows(path)
    notes = sorted({note for note, *_ in data})
    random.Random(0).shuffle(notes)
    folds = [set(notes[i::FOLDS]) for i in range(FOLDS)]
    for strength in (0.1, 0.3, 1.0):
        model_right = rules_right = 0
        for fold in folds:
            train = [row for row in data if row[0] not in fold]
            test = [row for row in data if row[0] in fold]
            vectorizer = DictVectorizer()
            model = LogisticRegression(C=strength, max_iter=2000)
            model.fit(vectorizer.fit_transform([row[1] for row in train]), [row[2] for row in train])
            predicted = model.predict(vectorizer.transform([row[1] for row in test]))
            model_right += sum(p == row[2] for p, row in zip(predicted, test, strict=True))
            rules_right += sum(row[3] == row[2] for row in test)
        print(f"C={strength}: model {100 * model_right / len(data):.2f}%, rules {100 * rules_right / len(data):.2f}%")


if __name__ == "__main__":
    main(*sys.argv[1:2])
