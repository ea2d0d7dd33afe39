"""Compact storage for millions of strings and links: one UTF-8 buffer and typed arrays instead of Python objects.

A Python str costs about 50 bytes before its first character and a dict entry about 100 more, so a knowledge base
of 5M names kept as strings in dicts needs gigabytes. Here a string costs its UTF-8 bytes plus about 20 bytes:

- `StringTable`: strings with ids 0, 1, ... in the order they were added, in one bytearray with their end offsets;
  a unique table also finds a string's id, through an open-addressing hash table (crc32 of the UTF-8 bytes, linear
  probing, at most half full) of int32 ids.
- `LinkLists`: per owner id an ordered list of (target id, source bits) links, chained through typed arrays; a
  link dropped from its list is reused by the next one added, so adding and removing links does not grow them.

Both are saved as raw little-endian arrays (`to_dict` / `from_dict`), so loading is a copy, not a rebuild.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterator

import numpy as np

_MIN_SLOTS = 16
_ARRAYS_ORDER = "little"


def array_bytes(values: array) -> bytes:
    if sys.byteorder != _ARRAYS_ORDER:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def array_from(typecode: str, data: bytes) -> array:
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder != _ARRAYS_ORDER:
        values.byteswap()
    return values


def as_numpy(values: array) -> np.ndarray:
    """A numpy copy of a typed array (a copy: a view would keep the array from growing)."""
    return np.array(values, dtype=np.dtype(values.typecode)) if len(values) else np.zeros(0, np.dtype(values.typecode))


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate (in user input) round-trips


class StringTable:
    """Strings with ids in insertion order.

    unique (bool): Keep each string once and find its id (`get`, `add`); else strings are only appended and read
        by id.
    """

    def __init__(self, unique: bool = True) -> None:
        self.unique = unique
        self._data = bytearray()
        self._ends = array("q")
        self._hashes = array("I")
        self._slots = array("i", bytes(4 * _MIN_SLOTS)) if unique else array("i")  # id + 1; 0 is an empty slot
        self._renewed = array("i")  # ids whose string was given a new id (`renew`): no longer found

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        return self._data[self._ends[i - 1] if i > 0 else 0 : self._ends[i]].decode("utf-8", "surrogatepass")

    def raw(self, i: int) -> bytes:
        """The UTF-8 bytes of string `i` (0 <= i < len)."""
        return bytes(self._data[self._ends[i - 1] if i > 0 else 0 : self._ends[i]])

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def get(self, text: str) -> int:
        """The id of `text`, or -1 (unique tables only)."""
        if not self.unique:
            raise TypeError("strings of a table that is not unique are found by id only")
        raw = _encode(text)
        return self._find(raw, zlib.crc32(raw))[0]

    def _find(self, raw: bytes, hashed: int) -> tuple[int, int]:
        """(id or -1, the slot where the probe for `raw` ended)."""
        slots, hashes, ends = self._slots, self._hashes, self._ends
        mask = len(slots) - 1
        slot = hashed & mask
        while True:
            found = slots[slot] - 1
            if found < 0:
                return -1, slot
            if hashes[found] == hashed and self._data[ends[found - 1] if found else 0 : ends[found]] == raw:
                return found, slot
            slot = (slot + 1) & mask

    def add(self, text: str) -> int:
        """The id of `text`: its existing id in a unique table, else a new one."""
        raw = text.encode("utf-8", "surrogatepass")
        n = len(self._ends)
        if self.unique:
            hashed = zlib.crc32(raw)
            found, slot = self._find(raw, hashed)
            if found >= 0:
                return found
            if 2 * (n + 1) > len(self._slots):
                self._rehash(2 * len(self._slots))
                slot = self._find(raw, hashed)[1]
            self._slots[slot] = n + 1
            self._hashes.append(hashed)
        self._data += raw
        self._ends.append(len(self._data))
        return n

    def renew(self, text: str) -> int:
        """Give a string of a unique table a new id, last in the order; the old id keeps the string but is no longer
        found (a name that is removed and added again goes last, as in a dict)."""
        raw = _encode(text)
        hashed = zlib.crc32(raw)
        found, slot = self._find(raw, hashed)
        if found < 0:
            return self.add(text)
        self._renewed.append(found)
        self._slots[slot] = len(self) + 1
        self._hashes.append(hashed)
        self._data += raw
        self._ends.append(len(self._data))
        if 2 * len(self) > len(self._slots):
            self._rehash(2 * len(self._slots))
        return len(self) - 1

    def _rehash(self, size: int) -> None:
        """Place every id in a table of `size` slots (a power of two), vectorized: each round, the pending ids
        whose slot is free take it (the first id of those wanting one slot), the others move one slot on; so
        every slot between an id's home and its place is taken, as linear probing requires."""
        hashes = as_numpy(self._hashes).astype(np.int64)
        slots = np.zeros(size, dtype=np.int32)
        pending = np.setdiff1d(np.arange(len(hashes), dtype=np.int64), as_numpy(self._renewed))
        position = hashes & (size - 1)
        while len(pending):
            want = position[pending]
            free = slots[want] == 0
            wanted, first = np.unique(want[free], return_index=True)
            placed = pending[free][first]
            slots[wanted] = placed + 1
            pending = np.setdiff1d(pending, placed, assume_unique=True)
            position[pending] = (position[pending] + 1) & (size - 1)
        self._slots = array("i", slots.tobytes())

    def digest(self) -> int:
        """crc32 of the strings and their boundaries: equal digests, equal tables (but for a crc32 collision)."""
        return zlib.crc32(array_bytes(self._ends), zlib.crc32(self._data))

    def to_dict(self) -> dict:
        return {
            "unique": self.unique,
            "data": bytes(self._data),
            "ends": array_bytes(self._ends),
            "hashes": array_bytes(self._hashes),
            "slots": array_bytes(self._slots),
            "renewed": array_bytes(self._renewed),
        }

    @classmethod
    def from_dict(cls, data: dict) -> StringTable:
        """A table saved by `to_dict`; ValueError when its parts do not fit together."""
        table = cls(bool(data["unique"]))
        table._data = bytearray(data["data"])
        table._ends = array_from("q", data["ends"])
        table._hashes = array_from("I", data["hashes"])
        table._slots = array_from("i", data["slots"])
        table._renewed = array_from("i", data["renewed"])
        n = len(table._ends)
        if len(table._hashes) != (n if table.unique else 0) or (n and table._ends[-1] != len(table._data)):
            raise ValueError(f"a table of {n} strings, {len(table._hashes)} hashes and {len(table._data)} bytes")
        if table.unique and (len(table._slots) < 2 * n or len(table._slots) & (len(table._slots) - 1)):
            raise ValueError(f"a hash table of {len(table._slots)} slots for {n} strings")
        return table

    def nbytes(self) -> int:
        """Bytes held by the table's buffers."""
        arrays = (self._ends, self._hashes, self._slots, self._renewed)
        return len(self._data) + sum(a.itemsize * len(a) for a in arrays)


class LinkLists:
    """Per owner (ids 0, 1, ...), an ordered list of links (target id, source bits), without duplicate targets.

    A link's bits are never 0 while it is in a list: a link whose last bit is cleared leaves its list and is
    reused. `owner_bits(owner)` is the union of the bits of its links, 0 when it has none.
    """

    def __init__(self) -> None:
        self.first = array("i")  # owner -> its first link, -1 when none
        self.last = array("i")  # owner -> its last link
        self.owner_bits = array("B")  # owner -> union of its links' bits
        self.next = array("i")  # link -> the next link of its owner, -1 at the end; the next free link when free
        self.owner = array("i")  # link -> owner, -1 when free
        self.target = array("i")
        self.bits = array("B")
        self.free = -1  # first free link

    def __len__(self) -> int:
        return len(self.first)

    def grow(self, owners: int) -> None:
        """Make room for owners with ids below `owners`."""
        missing = owners - len(self.first)
        if missing == 1:  # the usual case: one new owner
            self.first.append(-1)
            self.last.append(-1)
            self.owner_bits.append(0)
        elif missing > 0:
            self.first.extend([-1] * missing)
            self.last.extend([-1] * missing)
            self.owner_bits.extend(bytes(missing))

    def links(self, owner: int) -> Iterator[tuple[int, int, int]]:
        """(link, target, bits) of an owner's links, in the order they were added."""
        link = self.first[owner] if owner < len(self.first) else -1
        while link >= 0:
            yield link, self.target[link], self.bits[link]
            link = self.next[link]

    def targets(self, owner: int, mask: int = 0xFF) -> list[int]:
        """The targets of the owner's links that have a bit of `mask`, in order."""
        found = []
        link = self.first[owner] if owner < len(self.first) else -1
        while link >= 0:
            if self.bits[link] & mask:
                found.append(self.target[link])
            link = self.next[link]
        return found

    def add(self, owner: int, target: int, bit: int) -> None:
        """Set `bit` on the owner's link to `target`, appending the link when there is none."""
        if owner >= len(self.first):
            self.grow(owner + 1)
        link = self.first[owner]
        while link >= 0:
            if self.target[link] == target:
                self.bits[link] |= bit
                self.owner_bits[owner] |= bit
                return
            link = self.next[link]
        if self.free >= 0:
            link, self.free = self.free, self.next[self.free]
            self.next[link], self.owner[link], self.target[link], self.bits[link] = -1, owner, target, bit
        else:
            link = len(self.next)
            self.next.append(-1)
            self.owner.append(owner)
            self.target.append(target)
            self.bits.append(bit)
        if self.first[owner] >= 0:
            self.next[self.last[owner]] = link
        else:
            self.first[owner] = link
        self.last[owner] = link
        self.owner_bits[owner] |= bit

    def clear(self, owner: int, target: int, bit: int) -> bool:
        """Clear `bit` on the owner's link to `target` (dropping the link when no bit is left); whether it had it."""
        previous = -1
        for link, found, bits in self.links(owner):
            if found == target:
                if not bits & bit:
                    return False
                self.bits[link] = bits & ~bit
                if not self.bits[link]:
                    self._drop(owner, link, previous)
                self._update_bits(owner)
                return True
            previous = link
        return False

    def set(self, owner: int, links: list[tuple[int, int]]) -> None:
        """Make the owner's links exactly `links` ((target, bits) pairs, in order)."""
        self.grow(owner + 1)
        while self.first[owner] >= 0:
            self._drop(owner, self.first[owner], -1)
        self.owner_bits[owner] = 0
        for target, bits in links:
            if bits:
                self.add(owner, target, bits)

    def _drop(self, owner: int, link: int, previous: int) -> None:
        following = self.next[link]
        if previous >= 0:
            self.next[previous] = following
        else:
            self.first[owner] = following
        if self.last[owner] == link:
            self.last[owner] = previous
        self.next[link], self.owner[link], self.bits[link] = self.free, -1, 0
        self.free = link

    def _update_bits(self, owner: int) -> None:
        union = 0
        for _, _, bits in self.links(owner):
            union |= bits
        self.owner_bits[owner] = union

    def live(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(owner, target, bits) of every link in a list, as numpy arrays, in no particular order."""
        owner = as_numpy(self.owner)
        keep = owner >= 0
        return owner[keep], as_numpy(self.target)[keep], as_numpy(self.bits)[keep]

    def to_dict(self) -> dict:
        parts = {k: array_bytes(getattr(self, k)) for k in ("first", "last", "owner_bits", "next", "owner", "target")}
        return {**parts, "bits": bytes(self.bits), "free": self.free}

    @classmethod
    def from_dict(cls, data: dict) -> LinkLists:
        lists = cls()
        for name, code in (("first", "i"), ("last", "i"), ("owner_bits", "B"), ("next", "i"), ("owner", "i"),
                           ("target", "i"), ("bits", "B")):  # fmt: skip
            setattr(lists, name, array_from(code, data[name]))
        lists.free = int(data["free"])
        n, m = len(lists.first), len(lists.next)
        if not (len(lists.last) == len(lists.owner_bits) == n and len(lists.owner) == len(lists.target) == m):
            raise ValueError(f"link lists of {n} owners and {m} links do not fit together")
        if len(lists.bits) != m or not -1 <= lists.free < m:
            raise ValueError(f"link lists of {m} links with {len(lists.bits)} bit sets, free list at {lists.free}")
        return lists

    def nbytes(self) -> int:
        arrays = (self.first, self.last, self.owner_bits, self.next, self.owner, self.target, self.bits)
        return sum(a.itemsize * len(a) for a in arrays)
