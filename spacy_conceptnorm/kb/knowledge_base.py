"""The knowledge base: concepts and the names that denote them.

A concept (`concept.Concept`) has an id (kept as the ontology writes it), alternative ids, a canonical name,
parents, a definition and types. Names are stored normalized (see `text.normalize`) and map to the concepts they
denote, each link tagged by its source: `ontology` (synonyms from the vocabulary, the paper's O) or `domain`
(mentions from annotated text or user-supplied synonyms, the paper's D). One string may denote several concepts.

`load_kb` builds one from an ontology file (the formats of `kb.formats`) or loads one saved by `to_disk`.
"""

from __future__ import annotations

import json
import re
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import srsly
from spacy.util import registry

from ..errors import ConceptNormError, Errors
from ..io.files import atomic_open, check_format
from ..text.normalize import TextNormalizer
from .compact import LinkLists, StringTable, array_bytes, array_from, as_numpy
from .concept import Concept
from .formats import READERS, guess_format, read_records

ONTOLOGY = "ontology"
DOMAIN = "domain"
SOURCE_BITS = {ONTOLOGY: 1, DOMAIN: 2}
FORMAT_TAG, FORMAT_VERSION = "spacy_conceptnorm.kb", 2  # the saved format's name, not a module path

_PREFIX = re.compile(r"^[A-Za-z][\w.-]*:")


class ConceptTable(Mapping[str, Concept]):
    """The concepts of a knowledge base by id, in compact tables. A `Concept` is built each time one is read: change
    a concept with `KnowledgeBase.add_concept` (which merges ids, parents and types), not the object returned."""

    def __init__(self) -> None:
        self._ids = StringTable()  # concept ids; a concept's index is its position
        self._canonical = StringTable(unique=False)
        self._canonical_key = array("i")  # index -> name id of its normalized canonical name, -1 when empty
        self._extras = StringTable(unique=False)  # JSON [alt_ids, parents, definition, types] records
        self._extras_of = array("i")  # index -> its record in _extras, -1 when all are empty

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __contains__(self, concept_id: object) -> bool:
        return isinstance(concept_id, str) and self._ids.get(concept_id) >= 0

    def __getitem__(self, concept_id: str) -> Concept:
        index = self.index(concept_id) if isinstance(concept_id, str) else -1
        if index < 0:
            raise KeyError(concept_id)
        return self.concept(index)

    def index(self, concept_id: str) -> int:
        """The index of the concept with this (primary) id, or -1."""
        return self._ids.get(concept_id)

    def id(self, index: int) -> str:
        return self._ids[index]

    def concept(self, index: int) -> Concept:
        record = self._extras_of[index]
        alt, parents, definition, types = json.loads(self._extras[record]) if record >= 0 else ((), (), "", ())
        return Concept(self._ids[index], self._canonical[index], tuple(alt), tuple(parents), definition, tuple(types))

    def add(self, concept: Concept) -> int:
        index = self._ids.add(concept.concept_id)
        self._canonical.add(concept.canonical_name)
        self._canonical_key.append(-1)
        self._extras_of.append(-1)
        self.set_extras(index, concept)
        return index

    def set_extras(self, index: int, concept: Concept) -> None:
        """Store the alternative ids, parents, definition and types of `concept` for the concept at `index`."""
        extras = [list(concept.alt_ids), list(concept.parents), concept.definition, list(concept.types)]
        if any(extras) or self._extras_of[index] >= 0:
            self._extras_of[index] = self._extras.add(json.dumps(extras, ensure_ascii=False))

    def to_dict(self) -> dict:
        return {
            "ids": self._ids.to_dict(),
            "canonical": self._canonical.to_dict(),
            "canonical_key": array_bytes(self._canonical_key),
            "extras": self._extras.to_dict(),
            "extras_of": array_bytes(self._extras_of),
        }

    @classmethod
    def from_dict(cls, data: dict, names: int) -> ConceptTable:
        """A table saved by `to_dict` for a KB of `names` names; ValueError when its parts do not fit."""
        table = cls()
        table._ids = StringTable.from_dict(data["ids"])
        table._canonical = StringTable.from_dict(data["canonical"])
        table._canonical_key = array_from("i", data["canonical_key"])
        table._extras = StringTable.from_dict(data["extras"])
        table._extras_of = array_from("i", data["extras_of"])
        n = len(table._ids)
        if not len(table._canonical) == len(table._canonical_key) == len(table._extras_of) == n:
            raise ValueError(f"{n} concepts but {len(table._canonical)} canonical names")
        _check_range("canonical name ids", table._canonical_key, -1, names)
        _check_range("concept records", table._extras_of, -1, len(table._extras))
        return table


class KnowledgeBase:
    """Concepts and their names, normalized, searchable by source.

    Names are kept in compact tables (`compact.StringTable`, `compact.LinkLists`): a name has an id, its position
    in the order names were added; a name that loses its last concept is no longer listed, and one linked again
    after that is a new name (a new id, last in the order, the surface form then given), as in a dict.

    normalizer (TextNormalizer): Maps names to their stored form; queries must use the same one.
    """

    def __init__(self, normalizer: TextNormalizer | None = None) -> None:
        self.normalizer = normalizer or TextNormalizer()
        self.concepts = ConceptTable()
        self._keys = StringTable()  # normalized names; a name's id is its position
        self._surfaces = StringTable(unique=False)
        self._surface_of = array("i")  # name id -> its surface form in _surfaces
        self._links = LinkLists()  # name id -> (concept index, source bits) links
        self._ids = StringTable()  # every id variant: ids, alternative ids, each with and without its prefix
        self._id_concept = array("i")  # variant -> concept index
        # (name, concept id, source bit) -> times the link was given again while present (`add_names(repeats=True)`):
        # removing it then takes one back, so adding and removing a pair that was already there keeps it
        self._repeats: dict[tuple[str, str, int], int] = {}

    # --- concepts and ids -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.concepts)

    def __contains__(self, concept_id: str) -> bool:
        return self.resolve(concept_id) is not None

    def add_concept(self, concept: Concept, synonyms: Iterable[str] = ()) -> None:
        """Add a concept, or merge ids, parents and synonyms into the one already there with the same id."""
        names = [concept.canonical_name, *synonyms]
        resolved = self.resolve(concept.concept_id)
        index = self.concepts.index(resolved if resolved is not None else concept.concept_id)
        new = index < 0
        if new:
            index = self.concepts.add(concept)
        else:
            existing = self.concepts.concept(index)
            merged = Concept(
                existing.concept_id,
                existing.canonical_name,
                alt_ids=_merged(existing.alt_ids, concept.ids, exclude=existing.concept_id),
                parents=_merged(existing.parents, concept.parents),
                definition=existing.definition or concept.definition,
                types=_merged(existing.types, concept.types),
            )
            if merged != existing:
                self.concepts.set_extras(index, merged)
            concept = merged
        for cid in concept.ids:
            for variant in _id_variants(cid):
                if self._ids.add(variant) == len(self._id_concept):  # the first concept to claim an id keeps it
                    self._id_concept.append(index)
        for i, name in enumerate(names):
            name_id, _ = self._link(name, index, ONTOLOGY)
            if new and i == 0:
                self.concepts._canonical_key[index] = name_id

    def resolve(self, concept_id: str) -> str | None:
        """The concept id that `concept_id` (the id itself, an alternative id, or one with/without a prefix such
        as `MESH:` or `OMIM:`) refers to, or None."""
        concept_id = concept_id.strip()
        found = self._ids.get(concept_id)
        if found < 0 and _PREFIX.match(concept_id):
            found = self._ids.get(_PREFIX.sub("", concept_id))
        return self.concepts.id(self._id_concept[found]) if found >= 0 else None

    def matches(self, gold_id: str, concept_id: str) -> bool:
        """Whether a gold id denotes the concept `concept_id` (any of its ids counts)."""
        return self.resolve(gold_id) == concept_id

    def canonical_key(self, concept_id: str) -> str:
        """The normalized canonical name of a concept ("" for an unknown id or an empty name)."""
        index = self.concepts.index(concept_id)
        name_id = self.concepts._canonical_key[index] if index >= 0 else -1
        return self._keys[name_id] if name_id >= 0 else ""

    # --- names --------------------------------------------------------------------------------------------------
    def _link(self, name: str, concept: int, source: str) -> tuple[int, bool]:
        """Link a name to a concept (by index) under a source; return the name's id (-1 for a name that normalizes
        to nothing) and whether the name is new for that source."""
        key = self.normalizer(name)
        if not key:
            return -1, False
        links = self._links
        name_id = self._keys.add(key)
        known = len(self._surface_of)
        if name_id < known and not links.owner_bits[name_id]:
            name_id = self._keys.renew(key)  # linked again after losing every concept: a new name, last in order
        if name_id >= known:
            self._surface_of.append(self._surfaces.add(name.strip()))
            links.grow(name_id + 1)
        bit = SOURCE_BITS[source]
        had_source = links.owner_bits[name_id] & bit
        links.add(name_id, concept, bit)
        return name_id, not had_source

    def add_names(
        self, pairs: Iterable[tuple[str, str]], source: str = DOMAIN, repeats: bool = False
    ) -> tuple[list[str], list[str]]:
        """Link (name, concept id) pairs under `source`, effective at once. Every pair is checked before any is
        applied, so a bad item changes nothing.

        pairs (Iterable[Tuple[str, str]]): Names and the ids of the concepts they denote (any id of the concept).
        source (str): `domain` or `ontology`.
        repeats (bool): Count a pair that is already linked, so that `remove_names(..., repeats=True)` takes
            that count back before the link itself.
        RETURNS (Tuple[List[str], List[str]]): The normalized names that are new for this source, and the
            concept ids that were not found (those pairs are skipped).
        """
        pairs = checked_pairs(pairs)
        bit = SOURCE_BITS[source]
        new, unknown = [], []
        for name, concept_id in pairs:
            resolved = self.resolve(concept_id)
            key = self.normalizer(name)
            if resolved is None:
                unknown.append(concept_id)
            elif repeats and resolved in self.concepts_for(key, bit):
                self._repeats[(key, resolved, bit)] = self._repeats.get((key, resolved, bit), 0) + 1
            elif self._link(name, self.concepts.index(resolved), source)[1]:
                new.append(key)
        return new, unknown

    def remove_names(
        self, pairs: Iterable[tuple[str, str | None]], source: str = DOMAIN, repeats: bool = False
    ) -> list[str]:
        """Unlink (name, concept id) pairs from `source`; a concept id of None unlinks the name from every
        concept under that source. With `repeats`, a link added again (`add_names(..., repeats=True)`) loses one
        repeat instead. Returns the normalized names that no longer have any concept in `source`."""
        pairs = checked_pairs(pairs, allow_none=True)
        bit = SOURCE_BITS[source]
        gone = []
        for name, concept_id in pairs:
            key = self.normalizer(name)
            name_id = self.name_id(key)
            if name_id < 0:
                continue
            if concept_id is None:
                targets = [target for _, target, _ in self._links.links(name_id)]
            else:
                resolved = self.resolve(concept_id)
                targets = [self.concepts.index(resolved) if resolved is not None else -1]
            for target in targets:
                cid = self.concepts.id(target) if target >= 0 else None
                count = self._repeats.pop((key, cid, bit), 0)
                if repeats and concept_id is not None and count:
                    if count > 1:
                        self._repeats[(key, cid, bit)] = count - 1
                elif target >= 0:
                    self._links.clear(name_id, target, bit)
            if not self._links.owner_bits[name_id] & bit:
                gone.append(key)
        return gone

    def saved_names(self, names: Iterable[str]) -> Callable[[], None]:
        """A copy of the entries of some names (and of the repeat counts): calling the returned function puts
        them back as they are now, e.g. to undo an `add_names` whose vectors could not be made."""
        saved = {}
        for key in {self.normalizer(n) for n in names}:
            name_id = self.name_id(key)
            if name_id >= 0:
                links = [(target, bits) for _, target, bits in self._links.links(name_id)]
                saved[key] = (self._surface_of[name_id], links)
            else:
                saved[key] = None
        repeats = dict(self._repeats)

        def restore() -> None:
            for key, entry in saved.items():
                name_id = self.name_id(key)
                if entry is not None:
                    if name_id < 0:  # removed since: back as a new name, last in order
                        name_id = self._keys.renew(key)
                        self._surface_of.append(entry[0])
                        self._links.grow(name_id + 1)
                    self._surface_of[name_id] = entry[0]
                    self._links.set(name_id, entry[1])
                elif name_id >= 0:
                    self._links.set(name_id, [])
            self._repeats = repeats

        return restore

    def names(self, source: str | None = None) -> list[str]:
        """Normalized names, in the order they were first added; only those given by `source` when it is set."""
        return [self._keys[i] for i in self.name_ids(source)]

    def name_ids(self, source: str | None = None) -> np.ndarray:
        """The ids of the names `names(source)` lists, ascending (int64)."""
        bits = as_numpy(self._links.owner_bits)
        return np.flatnonzero(bits if source is None else bits & SOURCE_BITS[source]).astype(np.int64)

    def name_id(self, name: str) -> int:
        """The id of a normalized name that has a concept, or -1."""
        name_id = self._keys.get(name)
        return name_id if name_id >= 0 and self._links.owner_bits[name_id] else -1

    def key_id(self, name: str) -> int:
        """The id of a normalized name, with or without concepts now, or -1 for one never added."""
        return self._keys.get(name)

    def name_key(self, name_id: int) -> str:
        """The normalized name with this id."""
        return self._keys[name_id]

    @property
    def name_capacity(self) -> int:
        """One more than the highest name id given so far (ids of names without concepts included)."""
        return len(self._keys)

    def names_digest(self) -> int:
        """A checksum of every name and its id (names without concepts included): equal digests, same ids."""
        return self._keys.digest()

    def concepts_for(self, name: str, sources: int = 3, normalized: bool = True) -> list[str]:
        """Ids of the concepts a name denotes under the given source bits (1 ontology, 2 domain, 3 both)."""
        name_id = self._keys.get(name if normalized else self.normalizer(name))
        return self.concepts_of(name_id, sources) if name_id >= 0 else []

    def concepts_of(self, name_id: int, sources: int = 3) -> list[str]:
        """`concepts_for` by name id."""
        return [self.concepts.id(target) for target in self._links.targets(name_id, sources)]

    def name_links(self, name: str) -> dict[str, int]:
        """The concepts of a normalized name with the source bits of each link ({} for an unknown name)."""
        name_id = self._keys.get(name)
        if name_id < 0:
            return {}
        return {self.concepts.id(target): bits for _, target, bits in self._links.links(name_id)}

    def surface(self, name: str) -> str:
        """The surface form first seen for a normalized name."""
        name_id = self.name_id(name)
        return self._surfaces[self._surface_of[name_id]] if name_id >= 0 else name

    def links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every link as arrays (name id, concept index, source bits), in no particular order."""
        return self._links.live()

    def concept_names(self, concept_id: str, sources: int = 3) -> list[str]:
        """Normalized names of one concept (a scan of every link: for training and inspection, not the hot path)."""
        index = self.concepts.index(concept_id)
        if index < 0:
            return []
        owner, target, bits = self.links()
        return [self._keys[i] for i in np.sort(owner[(target == index) & ((bits & sources) > 0)])]

    def nbytes(self) -> int:
        """Bytes held by the name and concept tables (the normalizer and Python overhead aside)."""
        tables = (self._keys, self._surfaces, self._ids, *vars(self.concepts).values())
        arrays = (self._surface_of, self._id_concept)
        return (
            sum(t.nbytes() if isinstance(t, StringTable) else t.itemsize * len(t) for t in tables)
            + sum(a.itemsize * len(a) for a in arrays)
            + self._links.nbytes()
        )

    # --- serialization ----------------------------------------------------------------------------------------
    def _parts(self) -> dict[str, Callable[[], object]]:
        """What is saved, by key, each made when called (so that a large KB's copies are made one at a time)."""
        return {
            "format": lambda: FORMAT_TAG,
            "version": lambda: FORMAT_VERSION,
            "normalizer": self.normalizer.to_dict,
            "concepts": self.concepts.to_dict,
            "ids": self._ids.to_dict,
            "id_concept": lambda: array_bytes(self._id_concept),
            "names": self._keys.to_dict,
            "surfaces": self._surfaces.to_dict,
            "surface_of": lambda: array_bytes(self._surface_of),
            "links": self._links.to_dict,
            "repeats": lambda: [[*link, count] for link, count in self._repeats.items()],
        }

    def to_dict(self) -> dict:
        return {key: make() for key, make in self._parts().items()}

    def to_disk(self, path: str | Path) -> None:
        """Write the knowledge base to one msgpack file (its tables as raw arrays, with their crc32), atomically,
        a table at a time: the crc32 first (made over the tables in key order), then each table written."""
        parts = self._parts()
        crc = 0
        for key in sorted(parts):
            crc = _crc32(parts[key](), zlib.crc32(key.encode("utf8"), crc))
        _write_entries(path, [*parts.items(), ("crc32", lambda: crc)])

    @classmethod
    def from_disk(cls, path: str | Path) -> KnowledgeBase:
        """Read a knowledge base written by `to_disk`; a truncated, corrupt or foreign file raises
        ConceptNormError naming it."""
        data = _read_entries(path)
        kb = cls(TextNormalizer(**data["normalizer"]))
        try:
            kb._read(data)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
        return kb

    def _read(self, data: dict) -> None:
        if data.pop("crc32") != _crc32(data):  # a flipped bit would give other names or ids, without a word
            raise ValueError("its tables do not match their checksum")
        self._keys = StringTable.from_dict(data["names"])
        self._surfaces = StringTable.from_dict(data["surfaces"])
        self._surface_of = array_from("i", data["surface_of"])
        self._links = LinkLists.from_dict(data["links"])
        self.concepts = ConceptTable.from_dict(data["concepts"], len(self._keys))
        self._ids = StringTable.from_dict(data["ids"])
        self._id_concept = array_from("i", data["id_concept"])
        n = len(self._keys)
        if not len(self._surface_of) == len(self._links) == n or len(self._id_concept) != len(self._ids):
            raise ValueError(f"{n} names, {len(self._surface_of)} surface forms and {len(self._links)} link lists")
        _check_range("surface forms", self._surface_of, 0, len(self._surfaces))
        _check_range("link targets", self._links.target, -1, len(self.concepts))
        _check_range("link owners", self._links.owner, -1, n)
        _check_range("id variants", self._id_concept, 0, len(self.concepts))
        self._repeats = {(key, cid, int(bit)): int(n) for key, cid, bit, n in data["repeats"]}

    @classmethod
    def from_records(
        cls, records: Iterable[tuple[Concept, list[str]]], normalizer: TextNormalizer | None = None
    ) -> KnowledgeBase:
        """A knowledge base from (concept, synonyms) records, read one at a time (a loader's stream)."""
        kb = cls(normalizer)
        for concept, synonyms in records:
            kb.add_concept(concept, synonyms)
        return kb


def _write_entries(path: str | Path, entries: list[tuple[str, Callable[[], object]]]) -> None:
    """One msgpack map of (key, function making the value), written an entry at a time, atomically (memory: the
    largest entry, not the file)."""
    packer = srsly.msgpack.Packer(use_bin_type=True)
    with atomic_open(path) as f:
        f.write(packer.pack_map_header(len(entries)))
        for key, make in entries:
            f.write(packer.pack(key))
            f.write(packer.pack(make()))


def _read_entries(path: str | Path) -> dict:
    """A saved knowledge base's map, read from the file an entry at a time; its format and version checked."""
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    data: dict = {}
    try:
        with open(path, "rb") as f:
            unpacker = srsly.msgpack.Unpacker(f, raw=False, max_buffer_size=2**31 - 1)
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                data[key] = unpacker.unpack()
                if key == "version":  # written after "format": a foreign file is refused before it is read whole
                    check_format(path, data, "knowledge base", FORMAT_TAG, FORMAT_VERSION)
    except ConceptNormError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on truncation
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
    return check_format(path, data, "knowledge base", FORMAT_TAG, FORMAT_VERSION)


def _crc32(value: object, crc: int = 0) -> int:
    """crc32 of saved data: bytes as they are, dicts key by key in sorted order, anything else as msgpack."""
    if isinstance(value, dict):
        for key in sorted(value):
            crc = _crc32(value[key], zlib.crc32(key.encode("utf8"), crc))
        return crc
    return zlib.crc32(value if isinstance(value, bytes) else srsly.msgpack_dumps(value), crc)


def _check_range(what: str, values: array, low: int, high: int) -> None:
    """ValueError unless every value is in [low, high)."""
    if len(values):
        found = as_numpy(values)
        if found.min() < low or found.max() >= high:
            raise ValueError(f"{what} out of range [{low}, {high}): {found.min()}..{found.max()}")


def checked_pairs(pairs: Iterable[tuple[str, str | None]], allow_none: bool = False) -> list[tuple[str, str | None]]:
    """The pairs as a list of (text, concept id) tuples; ConceptNormError naming the first item that is not one.
    With `allow_none`, the concept id may be None and an item may be a bare text (meaning (text, None))."""
    out = []
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise ConceptNormError((Errors.E985 if allow_none else Errors.E303).format(item=pairs))
    for pair in pairs:
        if allow_none and isinstance(pair, str):
            pair = (pair, None)
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)
        if not (ok and (isinstance(pair[1], str) or (allow_none and pair[1] is None))):
            raise ConceptNormError((Errors.E985 if allow_none else Errors.E303).format(item=pair))
        out.append((pair[0], pair[1]))
    return out


def _merged(a: tuple[str, ...], b: Iterable[str], exclude: str | None = None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for x in (*a, *b) if x != exclude))


def _id_variants(concept_id: str) -> list[str]:
    """An id and its form without a namespace prefix, so `MESH:D003920` and `D003920` find the same concept."""
    bare = _PREFIX.sub("", concept_id)
    return [concept_id, bare] if bare != concept_id else [concept_id]


@registry.misc("spacy_conceptnorm.load_kb.v1")
def load_kb(
    path: str | Path,
    format: str = "auto",
    normalizer: TextNormalizer | None = None,
    mrconso_sources: list[str] = [],  # noqa: B006 (spaCy configs pass lists)
    mrconso_languages: list[str] = ["ENG"],  # noqa: B006
) -> KnowledgeBase:
    """Build a KnowledgeBase from an ontology file, or load one saved with `KnowledgeBase.to_disk`.

    path (Path): The ontology file (`.gz` allowed), or a saved knowledge base (`.kb`).
    format (str): One of `auto`, `kb`, `ctd`, `medic`, `id_name`, `jsonl`, `obo`, `mrconso`.
    normalizer (TextNormalizer): Name normalization; the default lower-cases and drops punctuation and accents.
    mrconso_sources (List[str]): UMLS SABs to keep (MRCONSO only; empty keeps all).
    mrconso_languages (List[str]): UMLS languages to keep (MRCONSO only).
    RETURNS (KnowledgeBase): The knowledge base, ontology names tagged `ontology`.
    """
    path = Path(path)
    if format == "auto":
        format = "kb" if path.suffix == ".kb" else guess_format(path)
    if format == "kb":
        return KnowledgeBase.from_disk(path)
    if format not in READERS:
        raise ConceptNormError(Errors.E007.format(fmt=format, choices=["auto", "kb", *READERS]))
    kb = KnowledgeBase.from_records(read_records(path, format, mrconso_sources, mrconso_languages), normalizer)
    if not len(kb):
        raise ConceptNormError(Errors.E983.format(path=path, fmt=format))
    return kb
