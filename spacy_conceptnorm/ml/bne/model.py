"""The BNE network (Phan et al. 2019, section 3.2): a two-level BiLSTM over characters and words.

    h_w = [u_w ⊕ last(BiLSTM_char(t_1 .. t_m))]      one per word: frozen word vector ⊕ character summary
    h_s = max(BiLSTM_word(h_w1 .. h_wn))             max pooling over the words of the name
    f(s) = W h_s + b

`last` is the final hidden state of each direction of the character BiLSTM (forward after the last character,
backward after the first). Sequences are packed, so padding never enters a name's vector: the vector of a name
does not depend on the other names of its batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .vocab import Batch


@dataclass(frozen=True)
class BNEConfig:
    """Sizes of the network (the paper's in brackets).

    n_chars (int): Character ids, padding and unknown included.
    char_dim (int): Character embedding size (50).
    char_hidden (int): Character BiLSTM hidden size per direction (the paper: 200 for the BiLSTM's state, read
        here as both directions together).
    word_hidden (int): Word BiLSTM hidden size per direction (the paper: 200, as for char_hidden).
    out_dim (int): Name vector size (200).
    dropout (float): Dropout on the word representations while training (0.5).
    """

    n_chars: int
    char_dim: int = 50
    char_hidden: int = 100
    word_hidden: int = 100
    out_dim: int = 200
    dropout: float = 0.5

    def to_dict(self) -> dict:
        return asdict(self)


class BNE(nn.Module):
    """Biomedical Name Encoder.

    config (BNEConfig): The sizes.
    word_vectors (torch.Tensor): (words + 1, dim) pre-trained word vectors, row 0 zeros (padding, no vector);
        kept frozen, as in the paper.
    """

    def __init__(self, config: BNEConfig, word_vectors: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.words = nn.Embedding.from_pretrained(word_vectors.float(), freeze=True, padding_idx=0)
        self.chars = nn.Embedding(config.n_chars, config.char_dim, padding_idx=0)
        self.char_lstm = nn.LSTM(config.char_dim, config.char_hidden, batch_first=True, bidirectional=True)
        word_in = word_vectors.shape[1] + 2 * config.char_hidden
        self.word_lstm = nn.LSTM(word_in, config.word_hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(config.dropout)
        self.proj = nn.Linear(2 * config.word_hidden, config.out_dim)

    @property
    def word_dim(self) -> int:
        return self.words.embedding_dim

    def word_representations(self, batch: Batch, start: int = 0, end: int | None = None) -> torch.Tensor:
        """(distinct words, word_dim + 2 * char_hidden): [u_w ⊕ last(BiLSTM(characters))] for the distinct words
        of the batch (those from `start` to `end`)."""
        lengths = batch.char_lengths[start:end]
        char_ids = batch.char_ids[start:end, : int(lengths.max())]
        chars = pack_padded_sequence(self.chars(char_ids), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.char_lstm(chars)  # h_n: (2 directions, words, hidden), the last state of each
        return torch.cat([self.words(batch.word_ids[start:end]), h_n[0], h_n[1]], dim=-1)

    def forward(self, batch: Batch) -> torch.Tensor:
        """f(s) for every name of the batch: (names, out_dim), not normalized (the objectives use dot products)."""
        return self.pool_names(self.dropout(self.word_representations(batch)), batch.tokens, batch.lengths)

    def pool_names(self, word_reps: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """f(s) from the representations of the distinct words and each name's rows into them (see `Batch`)."""
        words = word_reps[tokens[:, : int(lengths.max())]]
        packed = pack_padded_sequence(words, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.word_lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, padding_value=float("-inf"))
        return self.proj(out.max(dim=1).values)

    def average_word_vectors(self, batch: Batch) -> torch.Tensor:
        """q(s) of the paper's option 2: the mean pre-trained vector of the words of each name that have one
        (a zero vector when none has)."""
        vectors = self.words(batch.word_ids)[batch.tokens]  # (names, words, dim); padding is row 0 = zeros
        known = (batch.word_ids[batch.tokens] > 0).sum(dim=1, keepdim=True).clamp(min=1)
        return vectors.sum(dim=1) / known
