"""Which row of a vector store holds which name of a knowledge base.

Rows are tied to the KB's name ids (two int64 arrays, not dicts of strings): row -> name id and name id -> row,
-1 for none. A name that leaves the KB frees its row; the row keeps its vector until another name takes it, so a
name that comes back before then gets its row back without being encoded again, and adding and removing synonyms
does not grow the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..kb.knowledge_base import KnowledgeBase


class RowTable:
    """The rows of a vector store and the KB names they hold.

    kb (KnowledgeBase): Gives the names' ids.
    """

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb
        self.row_name = np.zeros(0, dtype=np.int64)  # row -> KB name id, -1 for a free row
        self.name_row = np.zeros(0, dtype=np.int64)  # KB name id -> row, -1 for none
        self._freed: dict[str, int] = {}  # removed name -> its free row, whose vector is kept until taken

    def reset(self, row_name: np.ndarray) -> None:
        """Start over from each row's name id (-1 for a free row), e.g. after the store was built or loaded."""
        self.row_name = np.asarray(row_name, dtype=np.int64)
        self.name_row = np.full(self.kb.name_capacity, -1, dtype=np.int64)
        held = self.row_name >= 0
        self.name_row[self.row_name[held]] = np.flatnonzero(held)
        self._freed = {}

    def __len__(self) -> int:
        return len(self.row_name)

    def row_of(self, name: str) -> int:
        """The row of a normalized name, -1 for none."""
        name_id = self.kb.key_id(name)
        return int(self.name_row[name_id]) if 0 <= name_id < len(self.name_row) else -1

    def assign(self, row: int, name: str, rows: int) -> None:
        """Make `row` the row of `name` (a name of the KB); `rows` is the store's length, which the row table
        grows to."""
        name_id = self.kb.key_id(name)
        if name_id >= len(self.name_row):
            self.name_row = _grown(self.name_row, self.kb.name_capacity)
        if row >= len(self.row_name):
            self.row_name = _grown(self.row_name, rows)
        self.name_row[name_id], self.row_name[row] = row, name_id

    def restore(self, names: Iterable[str], rows: int) -> None:
        """Give names without a row the free row they had before they were removed, where it is still free."""
        for name in names:
            row = self._freed.pop(name, None) if self.row_of(name) < 0 else None
            if row is not None:
                self.assign(row, name, rows)

    def free_rows(self, held: Sequence[np.ndarray] = ()) -> list[int]:
        """Free rows, ascending, but for those in `held` (rows an index still holds: an HNSW index only hides
        removed rows)."""
        free = np.flatnonzero(self.row_name < 0)
        if len(held):
            free = np.setdiff1d(free, np.concatenate(held))
        return free.tolist()

    def take(self, rows: Iterable[int]) -> None:
        """Forget the names that `rows` were freed by: the rows get new vectors."""
        taken = set(rows)
        self._freed = {n: r for n, r in self._freed.items() if r not in taken}

    def release(self, name: str) -> None:
        """Free the row of a name that left the KB, keeping its vector until the row is taken."""
        row = self.row_of(name)
        if row >= 0:
            self.name_row[self.row_name[row]] = -1
            self.row_name[row] = -1
            self._freed[name] = row


class Rows(Mapping):
    """Normalized name -> row, read through a row table."""

    def __init__(self, table: RowTable) -> None:
        self.table = table

    def __getitem__(self, name: str) -> int:
        row = self.table.row_of(name) if isinstance(name, str) else -1
        if row < 0:
            raise KeyError(name)
        return row

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.table.row_of(name) >= 0

    def __iter__(self) -> Iterator[str]:
        key = self.table.kb.name_key
        return (key(i) for i in self.table.row_name.tolist() if i >= 0)

    def __len__(self) -> int:
        return int((self.table.row_name >= 0).sum())


class RowNames(Sequence):
    """Row -> normalized name (None for a free row), read through a row table."""

    def __init__(self, table: RowTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        name_id = int(self.table.row_name[row])
        return self.table.kb.name_key(name_id) if name_id >= 0 else None

    def __iter__(self) -> Iterator[str | None]:
        key = self.table.kb.name_key
        return (key(i) if i >= 0 else None for i in self.table.row_name.tolist())


def _grown(values: np.ndarray, size: int) -> np.ndarray:
    """`values` extended with -1 to at least `size` entries."""
    return np.concatenate([values, np.full(max(size - len(values), 0), -1, dtype=values.dtype)])
