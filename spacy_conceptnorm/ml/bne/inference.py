"""The BNE forward pass for encoding, with each BiLSTM's input projection computed once per symbol.

An LSTM's gates are W_ih x_t + b + W_hh h_(t-1). The inputs x_t of the character BiLSTM are rows of a small
embedding table, and those of the word BiLSTM are the representations of the distinct words of a chunk, so
W_ih x + b is computed once per character and once per distinct word instead of once per position; only the
recurrence runs per position. Same weights and arithmetic as `BNE.forward` in eval mode (equal up to float
rounding, which the tests check): training keeps torch's LSTM.

Per step the recurrence does one gather, one in-place `addmm_` and in-place element-wise updates of the prefix
of rows still running (sequences sorted longest first, as in a packed sequence). The gate rows are reordered to
(i, f, o, g) with the g rows doubled, so one `sigmoid_` covers all four gates, and tanh(x) is computed as
2σ(2x) - 1 (torch's CPU tanh costs about four sigmoids; the difference is float rounding, below 1e-6). The word
BiLSTM's max pooling is a running maximum, so the hidden states of every step are never stored and a whole chunk
of names runs in one call.
"""

from __future__ import annotations

import torch
from torch import nn

from .model import BNE
from .vocab import Batch


def _gate_rows(lstm: nn.LSTM, name: str) -> torch.Tensor:
    """A weight or bias of `lstm` with its gate rows in the order (i, f, o, g), the g rows doubled: then one
    sigmoid gives σ(i), σ(f), σ(o) and σ(2g), and tanh(g) = 2σ(2g) - 1 (doubling is exact in floating point)."""
    weight = getattr(lstm, name)
    i, f, g, o = weight.chunk(4)  # torch's gate order
    return torch.cat([i, f, o, 2 * g])


def _input_tables(lstm: nn.LSTM, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_ih x + b_ih + b_hh for every input row, forward and backward, gate columns as in `_gate_rows`."""
    return tuple(
        torch.addmm(_gate_rows(lstm, f"bias_ih_l0{s}") + _gate_rows(lstm, f"bias_hh_l0{s}"), inputs,
                    _gate_rows(lstm, f"weight_ih_l0{s}").T)
        for s in ("", "_reverse")
    )  # fmt: skip


def bilstm(
    lstm: nn.LSTM, tables: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor, lengths: torch.Tensor, pool: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a one-layer BiLSTM over sequences of table rows (no autograd: states are updated in place).

    lstm (nn.LSTM): Gives the recurrent weights.
    tables (Tuple[torch.Tensor, torch.Tensor]): Input gates per symbol, forward and backward (`_input_tables`).
    ids (torch.Tensor): (sequences, steps) rows of the tables; positions at or past a sequence's length are ignored.
    lengths (torch.Tensor): (sequences,) lengths, at least 1, on the CPU.
    pool (str): "last": the final states (forward after the last position, backward after the first); "max":
        the element-wise maximum of the hidden states over the positions of each sequence. (sequences, hidden)
        per direction.
    """
    if pool not in ("last", "max"):
        raise ValueError(f"pool must be 'last' or 'max', not {pool!r}")
    # Longest first, as a packed sequence: at step t the sequences still running are a prefix of the rows.
    order = torch.argsort(lengths, descending=True, stable=True)
    steps_ids = ids[order.to(ids.device)].T.contiguous()  # (steps, sequences): each step's ids contiguous
    running = torch.bincount(lengths, minlength=ids.shape[1] + 1).flip(0).cumsum(0).flip(0)[1:].tolist()
    n, steps, hidden = ids.shape[0], ids.shape[1], lstm.hidden_size
    results = []
    for direction, table in enumerate(tables):
        suffix = "_reverse" if direction else ""
        w_hh = _gate_rows(lstm, "weight_hh_l0" + suffix).T.contiguous()
        h, c = table.new_zeros(n, hidden), table.new_zeros(n, hidden)
        best = table.new_full((n, hidden), float("-inf")) if pool == "max" else None
        for t in range(steps - 1, -1, -1) if direction else range(steps):
            k = running[t]  # backward, a sequence starts at its last position from the zero state
            if not k:
                continue
            h_k, c_k = h[:k], c[:k]
            gates = table.index_select(0, steps_ids[t, :k]).addmm_(h_k, w_hh)
            sig = gates.sigmoid_()
            g = sig[:, 3 * hidden :].mul_(2).sub_(1)  # tanh(g) = 2σ(2g) - 1
            c_k.mul_(sig[:, hidden : 2 * hidden]).addcmul_(sig[:, :hidden], g)  # c = f * c + i * g
            torch.mul(c_k, 2, out=h_k).sigmoid_().mul_(2).sub_(1).mul_(sig[:, 2 * hidden : 3 * hidden])  # o tanh(c)
            if best is not None:
                torch.maximum(best[:k], h_k, out=best[:k])
        state = h if best is None else best
        unsorted = torch.empty_like(state)
        unsorted[order.to(unsorted.device)] = state
        results.append(unsorted)
    return results[0], results[1]


def word_representations(model: BNE, batch: Batch, start: int = 0, end: int | None = None) -> torch.Tensor:
    """`BNE.word_representations` in eval mode: [u_w ⊕ last(BiLSTM(characters))] for distinct words start:end."""
    lengths = batch.char_lengths[start:end]
    char_ids = batch.char_ids[start:end, : int(lengths.max())]
    forward, backward = bilstm(model.char_lstm, _input_tables(model.char_lstm, model.chars.weight), char_ids,
                               lengths, pool="last")  # fmt: skip
    return torch.cat([model.words(batch.word_ids[start:end]), forward, backward], dim=-1)


def pool_names(model: BNE, tables: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor, lengths: torch.Tensor):
    """`BNE.pool_names` in eval mode, from the word BiLSTM's input gates of the distinct words (`word_tables`)."""
    tokens = tokens[:, : int(lengths.max())]
    forward, backward = bilstm(model.word_lstm, tables, tokens, lengths, pool="max")
    return model.proj(torch.cat([forward, backward], dim=-1))


def word_tables(model: BNE, word_reps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The word BiLSTM's input gates for each distinct word representation, forward and backward."""
    return _input_tables(model.word_lstm, word_reps)
