"""Names to the BNE network's inputs: word ids (pre-trained word vectors) and character ids per word.

Names are normalized with the knowledge base's default `TextNormalizer` (lower-cased, accents and punctuation
dropped) and split on spaces, so a KB key and its raw surface form give the same input. Id 0 is padding and, for
words, also "no pre-trained vector" (a zero row); character id 1 is an unknown character.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...text.normalize import TextNormalizer

PAD, UNK_CHAR = 0, 1
MAX_WORDS = 32  # words kept per name (MEDIC's longest normalized name has 25)
MAX_CHARS = 32  # characters kept per word


def tokenize(text: str, normalizer: TextNormalizer) -> list[str]:
    """The words of a name after normalization, at most MAX_WORDS."""
    return normalizer(text).split()[:MAX_WORDS]


@dataclass
class Batch:
    """A padded batch of names.

    word_ids (torch.Tensor): (distinct words,) ids into the pre-trained word vectors (0: none).
    char_ids (torch.Tensor): (distinct words, chars) character ids, padded with 0.
    char_lengths (torch.Tensor): (distinct words,) characters per word.
    tokens (torch.Tensor): (names, words) row of each word of each name in the distinct words; row 0 is the empty
        word, which pads and stands for an empty name.
    lengths (torch.Tensor): (names,) words per name; an empty name counts 1 (the empty word).
    """

    word_ids: torch.Tensor
    char_ids: torch.Tensor
    char_lengths: torch.Tensor
    tokens: torch.Tensor
    lengths: torch.Tensor

    def to(self, device: str) -> Batch:
        """The batch on `device`; `lengths` stays on the CPU, where packing reads it."""
        if device == "cpu":
            return self
        move = [t.to(device) for t in (self.word_ids, self.char_ids, self.tokens)]
        return Batch(move[0], move[1], self.char_lengths, move[2], self.lengths)


@dataclass
class Vocab:
    """Words with pre-trained vectors and the characters the network knows.

    words (List[str]): Words in the order of the word-vector rows 1..n (row 0 is the zero vector).
    chars (List[str]): Characters in the order of the character ids 2..n.
    normalizer (TextNormalizer): Applied to every name before splitting it into words.
    """

    words: list[str]
    chars: list[str]
    normalizer: TextNormalizer = field(default_factory=TextNormalizer)

    def __post_init__(self) -> None:
        self.word_index = {w: i + 1 for i, w in enumerate(self.words)}
        self.char_index = {c: i + 2 for i, c in enumerate(self.chars)}

    @classmethod
    def build(cls, words: Sequence[str], names: Iterable[str], normalizer: TextNormalizer | None = None) -> Vocab:
        """A vocabulary for the given vector words, with the characters of the training names (sorted)."""
        normalizer = normalizer or TextNormalizer()
        chars = sorted({c for name in names for c in normalizer(name).replace(" ", "")})
        return cls(list(words), chars, normalizer)

    @property
    def n_chars(self) -> int:
        return len(self.chars) + 2

    def char_ids(self, word: str) -> list[int]:
        return [self.char_index.get(c, UNK_CHAR) for c in word[:MAX_CHARS]] or [UNK_CHAR]

    def batch(self, names: Sequence[str]) -> Batch:
        """Pad a batch of names; each distinct word appears once, so its character BiLSTM runs once."""
        rows: dict[str, int] = {"": 0}  # row 0: the empty word, what an empty name and padding point at
        words: list[str] = []
        counts: list[int] = []
        for name in names:
            name_words = tokenize(name, self.normalizer)
            counts.append(len(name_words))
            words.extend(name_words)
        counts = np.array(counts, dtype=np.int64)
        token_ids = [rows.setdefault(w, len(rows)) for w in words]
        distinct = list(rows)
        char_seqs = [self.char_ids(w) for w in distinct]
        char_lengths = np.fromiter(map(len, char_seqs), dtype=np.int64, count=len(char_seqs))
        char_ids = np.zeros((len(distinct), int(char_lengths.max())), dtype=np.int64)
        char_ids[np.arange(char_ids.shape[1]) < char_lengths[:, None]] = [c for seq in char_seqs for c in seq]
        lengths = np.maximum(counts, 1)
        tokens = np.zeros((len(names), int(lengths.max()) if len(names) else 1), dtype=np.int64)
        tokens[np.arange(tokens.shape[1]) < counts[:, None]] = token_ids  # row-major: each name's words in order
        word_ids = np.array([self.word_index.get(w, PAD) for w in distinct], dtype=np.int64)
        return Batch(
            torch.from_numpy(word_ids),
            torch.from_numpy(char_ids),
            torch.from_numpy(char_lengths),
            torch.from_numpy(tokens),
            torch.from_numpy(lengths),
        )

    def to_dict(self) -> dict:
        return {"words": self.words, "chars": self.chars, "normalizer": self.normalizer.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Vocab:
        return cls(list(data["words"]), list(data["chars"]), TextNormalizer(**data["normalizer"]))
