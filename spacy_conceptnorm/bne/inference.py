"""The BNE forward pass for encoding, with each BiLSTM's input projection computed once per symbol.

An LSTM's gates are W_ih x_t + b + W_hh h_(t-1). The inputs x_t of the character BiLSTM are rows of a small
embedding table, and those of the word BiLSTM are the representations of the distinct words of a chunk, so
W_ih x + b is computed once per character and once per distinct word instead of once per position; only the
recurrence runs per position. Same weights and arithmetic as `BNE.forward` in eval mode (equal up to float
rounding, which the tests check): training keeps torch's LSTM.
"""

from __future__ import annotations

import torch
from torch import nn

from .model import BNE
from .vocab import Batch


def _input_tables(lstm: nn.LSTM, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_ih x + b_ih + b_hh for every input row, for the forward and the backward direction."""
    return tuple(
        inputs @ getattr(lstm, f"weight_ih_l0{s}").T + getattr(lstm, f"bias_ih_l0{s}") + getattr(lstm, f"bias_hh_l0{s}")
        for s in ("", "_reverse")
    )


def _step(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    i, f, g, o = gates.chunk(4, dim=-1)  # torch's gate order
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def bilstm(
    lstm: nn.LSTM, tables: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor, lengths: torch.Tensor, outputs: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a one-layer BiLSTM over sequences of table rows (no autograd: states are updated in place).

    lstm (nn.LSTM): Gives the recurrent weights.
    tables (Tuple[torch.Tensor, torch.Tensor]): Input gates per symbol, forward and backward (`_input_tables`).
    ids (torch.Tensor): (sequences, steps) rows of the tables; positions at or past a sequence's length are ignored.
    lengths (torch.Tensor): (sequences,) lengths, at least 1.
    outputs (bool): Return the hidden states of every step, (sequences, steps, hidden) per direction, zeros past a
        sequence's end; else the final states, (sequences, hidden) per direction (forward after the last position,
        backward after the first).
    """
    # Longest first, as a packed sequence: at step t the sequences still running are a prefix of the rows.
    order = torch.argsort(lengths, descending=True, stable=True)
    ids = ids[order.to(ids.device)]
    running = torch.bincount(lengths, minlength=ids.shape[1] + 1).flip(0).cumsum(0).flip(0)[1:].tolist()
    n, steps, hidden = ids.shape[0], ids.shape[1], lstm.hidden_size
    results = []
    for direction, table in enumerate(tables):
        w_hh = getattr(lstm, "weight_hh_l0" + ("_reverse" if direction else "")).T
        h, c = table.new_zeros(n, hidden), table.new_zeros(n, hidden)
        states = table.new_zeros(n, steps, hidden) if outputs else None
        for t in range(steps - 1, -1, -1) if direction else range(steps):
            k = running[t]  # backward, a sequence starts at its last position from the zero state
            h[:k], c[:k] = _step(table[ids[:k, t]] + h[:k] @ w_hh, c[:k])
            if outputs:
                states[:k, t] = h[:k]
        unsorted = torch.empty_like(states if outputs else h)
        unsorted[order.to(unsorted.device)] = states if outputs else h
        results.append(unsorted)
    return results[0], results[1]


def word_representations(model: BNE, batch: Batch, start: int = 0, end: int | None = None) -> torch.Tensor:
    """`BNE.word_representations` in eval mode: [u_w ⊕ last(BiLSTM(characters))] for distinct words start:end."""
    lengths = batch.char_lengths[start:end]
    char_ids = batch.char_ids[start:end, : int(lengths.max())]
    forward, backward = bilstm(model.char_lstm, _input_tables(model.char_lstm, model.chars.weight), char_ids,
                               lengths, outputs=False)  # fmt: skip
    return torch.cat([model.words(batch.word_ids[start:end]), forward, backward], dim=-1)


def pool_names(model: BNE, tables: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor, lengths: torch.Tensor):
    """`BNE.pool_names` in eval mode, from the word BiLSTM's input gates of the distinct words (`word_tables`)."""
    tokens = tokens[:, : int(lengths.max())]
    forward, backward = bilstm(model.word_lstm, tables, tokens, lengths, outputs=True)
    states = torch.cat([forward, backward], dim=-1)
    steps = torch.arange(tokens.shape[1], device=tokens.device)
    valid = steps[None, :, None] < lengths.to(tokens.device)[:, None, None]
    return model.proj(states.masked_fill(~valid, float("-inf")).max(dim=1).values)


def word_tables(model: BNE, word_reps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The word BiLSTM's input gates for each distinct word representation, forward and backward."""
    return _input_tables(model.word_lstm, word_reps)
