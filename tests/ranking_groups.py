"""Ranking groups from the MEDIC sample, for the pair scorers' tests."""

import random
from pathlib import Path

from spacy_conceptnorm.linking.pair_scorer import RankingGroup

FIXTURES = Path(__file__).parent / "fixtures"


def _words(text: str) -> set[str]:
    return set(text.lower().replace(",", " ").split())


def medic_groups(seed: int = 0, wrong: int = 7, context: bool = False) -> list[RankingGroup]:
    """Per MEDIC sample concept with two names or more: a synonym as the mention, the concept's name sharing the
    most words with it as the right name, and names of other concepts, preferably sharing a word, as the wrong ones
    (the right name at a random position); with `context`, the mention in a sentence of its own."""
    rng = random.Random(seed)
    concepts = []
    for line in (FIXTURES / "medic_sample.txt").read_text(encoding="utf8").splitlines():
        names = [n.replace("&apos;", "'") for n in line.split("||", 1)[1].split("|")]
        if len(names) >= 2:
            concepts.append(names)
    words = {n: _words(n) for names in concepts for n in names}
    groups = []
    for i, names in enumerate(concepts):
        mention = names[1]
        right = max((n for n in names if n != mention), key=lambda n: len(words[n] & words[mention]))
        others = [n for j, c in enumerate(concepts) if j != i for n in c]
        sharing = [n for n in others if words[mention] & words[n]]
        chosen = rng.sample(sharing, min(wrong, len(sharing)))
        chosen += rng.sample([n for n in others if n not in chosen], wrong - len(chosen))
        position = rng.randrange(wrong + 1)
        chosen.insert(position, right)
        labels = [int(j == position) for j in range(wrong + 1)]
        text = f"Patients with [{mention}] were seen in clinic {i}." if context else ""
        groups.append(RankingGroup(mention, chosen, labels, text))
    return groups
