"""Whether a small transformer, fine-tuned on the annotated whole notes, gets more statuses right than
`clinical_context`'s rules: the packaged all-MiniLM-L6-v2 reads the rules' status, the section, the sentence before
and the entity's sentence with the entity marked, and predicts the status; 5-fold cross-validation by note on the
dev notes, the folds of `benchmarks.assertion_model`.

    python -m benchmarks.assertion_transformer [docs/clinical_notes/whole/dev.jsonl] [epochs] [folds, e.g. 0,1]

It prints the model's accuracy and the rules' on each fold and over the folds run (all five by default).
"""

from __future__ import annotations

import random
import sys

import torch
from spacy.tokens import Span
from transformers import AutoModel, AutoTokenizer

from benchmarks.assertion_model import rows
from spacy_conceptnorm.ml.name_encoder import packaged_model_path
from spacy_conceptnorm.pipeline.clinical_context import STATUSES

FOLDS = 5
LEFT_WORDS, RIGHT_WORDS = 48, 24


def text_of(ent: Span) -> str:
    """The model's input for one entity, its status set by clinical_context."""
    doc, sent = ent.doc, ent.sent
    start = doc[sent.start - 1].sent.start if sent.start > 0 else sent.start
    left = [t.text for t in doc[start : ent.start]][-LEFT_WORDS:]
    right = [t.text for t in doc[ent.end : sent.end]][:RIGHT_WORDS]
    return f"{ent._.assertion} ; {ent._.section_category} ; {' '.join(left)} << {ent.text} >> {' '.join(right)}"


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = AutoModel.from_pretrained(packaged_model_path())
        self.out = torch.nn.Linear(self.encoder.config.hidden_size, len(STATUSES))

    def forward(self, batch: dict) -> torch.Tensor:
        hidden = self.encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return self.out((hidden * mask).sum(1) / mask.sum(1))


def fit_predict(train: list, test: list, epochs: int, seed: int = 0) -> list[str]:
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(packaged_model_path())
    model = Classifier()
    labels = {status: i for i, status in enumerate(STATUSES)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-5, weight_decay=0.01)
    order = list(range(len(train)))
    rng = random.Random(seed)

    def encode(texts: list[str]) -> dict:
        return tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")

    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), 16):
            chunk = [train[j] for j in order[i : i + 16]]
            loss = torch.nn.functional.cross_entropy(
                model(encode([row[1] for row in chunk])), torch.tensor([labels[row[2]] for row in chunk])
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    predicted = []
    with torch.no_grad():
        for i in range(0, len(test), 64):
            logits = model(encode([row[1] for row in test[i : i + 64]]))
            predicted += [STATUSES[k] for k in logits.argmax(-1).tolist()]
    return predicted


def main(path: str = "docs/clinical_notes/whole/dev.jsonl", epochs: str = "2", run: str = "0,1,2,3,4") -> None:
    torch.set_num_threads(2)
    data = rows(path, text_of)
    notes = sorted({note for note, *_ in data})
    random.Random(0).shuffle(notes)
    folds = [set(notes[i::FOLDS]) for i in range(FOLDS)]
    model_right = rules_right = n = 0
    for k in map(int, run.split(",")):
        fold = folds[k]
        train = [row for row in data if row[0] not in fold]
        test = [row for row in data if row[0] in fold]
        predicted = fit_predict(train, test, int(epochs))
        right = sum(p == row[2] for p, row in zip(predicted, test, strict=True))
        rules = sum(row[3] == row[2] for row in test)
        model_right, rules_right, n = model_right + right, rules_right + rules, n + len(test)
        rate = 100 / len(test)
        print(f"fold {k}: {len(test)} spans, model {right * rate:.2f}%, rules {rules * rate:.2f}%", flush=True)
    print(f"folds {run}: model {100 * model_right / n:.2f}%, rules {100 * rules_right / n:.2f}%")


if __name__ == "__main__":
    main(*sys.argv[1:4])
