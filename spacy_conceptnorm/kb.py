"""The knowledge base: concepts and the names that denote them.

A concept has an id (kept as the ontology writes it), alternative ids, a canonical name, parents, a definition and
types. Names are stored normalized (see `text.normalize`) and map to the concepts they denote, each link tagged by
its source: `ontology` (synonyms from the vocabulary, the paper's O) or `domain` (mentions from annotated text or
user-supplied synonyms, the paper's D). One string may denote several concepts.

Loaders stream their file and report `file:line` for a malformed line. Formats: CTD TSV (MEDIC diseases,
chemicals), the MEDIC/BioSyn pipe format (`ID|ALT||name|synonym...`, also `ID||name` dictionaries),
scispacy-compatible JSONL, OBO and UMLS MRCONSO.RRF.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import srsly
from spacy.util import registry

from .errors import ConceptNormError, Errors
from .text.normalize import TextNormalizer
from .util import read_lines, read_msgpack, write_msgpack

ONTOLOGY = "ontology"
DOMAIN = "domain"
SOURCE_BITS = {ONTOLOGY: 1, DOMAIN: 2}
FORMAT_TAG, FORMAT_VERSION = "spacy_conceptnorm.kb", 1

_PREFIX = re.compile(r"^[A-Za-z][\w.-]*:")


@dataclass
class Concept:
    """A concept of the ontology.

    concept_id (str): The id, as the ontology writes it.
    canonical_name (str): The preferred name.
    alt_ids (tuple): Other ids of the same concept (e.g. OMIM ids of a MEDIC concept); a gold id matches the
        concept when it is any of its ids.
    parents (tuple): Ids of the parent concepts.
    definition (str): A definition, if the ontology gives one.
    types (tuple): Semantic types or categories.
    """

    concept_id: str
    canonical_name: str
    alt_ids: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    definition: str = ""
    types: tuple[str, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.concept_id, *self.alt_ids)


@dataclass
class NameEntry:
    """A normalized name: its first surface form and, per concept, the bit set of sources that give it."""

    surface: str
    concepts: dict[str, int] = field(default_factory=dict)


class KnowledgeBase:
    """Concepts and their names, normalized, searchable by source.

    normalizer (TextNormalizer): Maps names to their stored form; queries must use the same one.
    """

    def __init__(self, normalizer: TextNormalizer | None = None) -> None:
        self.normalizer = normalizer or TextNormalizer()
        self.concepts: dict[str, Concept] = {}
        self._names: dict[str, NameEntry] = {}
        self._ids: dict[str, str] = {}  # every id variant -> concept id
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
        existing = self.concepts.get(self.resolve(concept.concept_id) or concept.concept_id)
        synonyms = [concept.canonical_name, *synonyms]
        if existing is None:
            self.concepts[concept.concept_id] = concept
        else:
            existing.alt_ids = _merged(existing.alt_ids, concept.ids, exclude=existing.concept_id)
            existing.parents = _merged(existing.parents, concept.parents)
            existing.definition = existing.definition or concept.definition
            existing.types = _merged(existing.types, concept.types)
            concept = existing
        for cid in concept.ids:
            for variant in _id_variants(cid):
                self._ids.setdefault(variant, concept.concept_id)
        for name in synonyms:
            self._link(name, concept.concept_id, ONTOLOGY)

    def resolve(self, concept_id: str) -> str | None:
        """The concept id that `concept_id` (the id itself, an alternative id, or one with/without a prefix such
        as `MESH:` or `OMIM:`) refers to, or None."""
        concept_id = concept_id.strip()
        found = self._ids.get(concept_id)
        if found is None and _PREFIX.match(concept_id):
            found = self._ids.get(_PREFIX.sub("", concept_id))
        return found

    def matches(self, gold_id: str, concept_id: str) -> bool:
        """Whether a gold id denotes the concept `concept_id` (any of its ids counts)."""
        return self.resolve(gold_id) == concept_id

    # --- names --------------------------------------------------------------------------------------------------
    def _link(self, name: str, concept_id: str, source: str) -> bool:
        """Link a name to a concept under a source; return whether the name is new for that source."""
        key = self.normalizer(name)
        if not key:
            return False
        bit = SOURCE_BITS[source]
        entry = self._names.get(key)
        if entry is None:
            entry = self._names[key] = NameEntry(surface=name.strip())
        had_source = any(bits & bit for bits in entry.concepts.values())
        entry.concepts[concept_id] = entry.concepts.get(concept_id, 0) | bit
        return not had_source

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
            elif self._link(name, resolved, source):
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
            entry = self._names.get(key)
            if entry is None:
                continue
            targets = list(entry.concepts) if concept_id is None else [self.resolve(concept_id)]
            for cid in targets:
                count = self._repeats.pop((key, cid, bit), 0)
                if repeats and concept_id is not None and count:
                    if count > 1:
                        self._repeats[(key, cid, bit)] = count - 1
                elif cid in entry.concepts:
                    entry.concepts[cid] &= ~bit
                    if not entry.concepts[cid]:
                        del entry.concepts[cid]
            if not any(bits & bit for bits in entry.concepts.values()):
                gone.append(key)
            if not entry.concepts:
                del self._names[key]
        return gone

    def saved_names(self, names: Iterable[str]) -> Callable[[], None]:
        """A copy of the entries of some names (and of the repeat counts): calling the returned function puts
        them back as they are now, e.g. to undo an `add_names` whose vectors could not be made."""
        keys = {self.normalizer(n) for n in names}
        saved = {k: NameEntry(e.surface, dict(e.concepts)) if (e := self._names.get(k)) else None for k in keys}
        repeats = dict(self._repeats)

        def restore() -> None:
            for key, entry in saved.items():
                if entry is None:
                    self._names.pop(key, None)
                else:
                    self._names[key] = entry
            self._repeats = repeats

        return restore

    def names(self, source: str | None = None) -> list[str]:
        """Normalized names, in insertion order; only those given by `source` when it is set."""
        if source is None:
            return list(self._names)
        bit = SOURCE_BITS[source]
        return [k for k, e in self._names.items() if any(b & bit for b in e.concepts.values())]

    def concepts_for(self, name: str, sources: int = 3, normalized: bool = True) -> list[str]:
        """Ids of the concepts a name denotes under the given source bits (1 ontology, 2 domain, 3 both)."""
        entry = self._names.get(name if normalized else self.normalizer(name))
        if entry is None:
            return []
        return [cid for cid, bits in entry.concepts.items() if bits & sources]

    def surface(self, name: str) -> str:
        """The surface form first seen for a normalized name."""
        entry = self._names.get(name)
        return entry.surface if entry else name

    def concept_names(self, concept_id: str, sources: int = 3) -> list[str]:
        """Normalized names of one concept (a linear scan: for training and inspection, not the hot path)."""
        return [k for k, e in self._names.items() if e.concepts.get(concept_id, 0) & sources]

    # --- serialization ----------------------------------------------------------------------------------------
    def to_disk(self, path: str | Path) -> None:
        """Write the knowledge base to one msgpack file, atomically."""
        data = {
            "format": FORMAT_TAG,
            "version": FORMAT_VERSION,
            "normalizer": self.normalizer.to_dict(),
            "concepts": [
                [c.concept_id, c.canonical_name, list(c.alt_ids), list(c.parents), c.definition, list(c.types)]
                for c in self.concepts.values()
            ],
            "names": [[k, e.surface, list(e.concepts.items())] for k, e in self._names.items()],
            "repeats": [[*link, count] for link, count in self._repeats.items()],
        }
        write_msgpack(path, data)

    @classmethod
    def from_disk(cls, path: str | Path) -> KnowledgeBase:
        """Read a knowledge base written by `to_disk`; a truncated or foreign file raises ConceptNormError."""
        data = read_msgpack(path, "knowledge base", FORMAT_TAG, FORMAT_VERSION)
        kb = cls(TextNormalizer(**data["normalizer"]))
        try:
            for cid, name, alt, parents, definition, types in data["concepts"]:
                concept = Concept(cid, name, tuple(alt), tuple(parents), definition, tuple(types))
                kb.concepts[cid] = concept
                for any_id in concept.ids:
                    for variant in _id_variants(any_id):
                        kb._ids.setdefault(variant, cid)
            for key, surface, links in data["names"]:
                kb._names[key] = NameEntry(surface, {cid: bits for cid, bits in links})
            kb._repeats = {(key, cid, int(bit)): int(n) for key, cid, bit, n in data.get("repeats", [])}
        except (KeyError, TypeError, ValueError) as e:
            raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
        return kb

    @classmethod
    def from_records(
        cls, records: Iterable[tuple[Concept, list[str]]], normalizer: TextNormalizer | None = None
    ) -> KnowledgeBase:
        kb = cls(normalizer)
        for concept, synonyms in records:
            kb.add_concept(concept, synonyms)
        return kb


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


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split("|") if v.strip())


# --- loaders ------------------------------------------------------------------------------------------------------
Record = tuple[Concept, list[str]]


def _malformed(path: Path, lineno: int, reason: str, line: str) -> ConceptNormError:
    return ConceptNormError(Errors.E001.format(path=path, line=lineno, reason=reason, text=line[:200]))


def read_ctd_tsv(path: str | Path) -> Iterator[Record]:
    """CTD vocabulary TSV (`CTD_diseases.tsv[.gz]`, `CTD_chemicals.tsv[.gz]`). Column names come from the
    `# Fields:` header; ids keep their `MESH:`/`OMIM:` prefixes."""
    path = Path(path)
    columns = ["DiseaseName", "DiseaseID", "AltDiseaseIDs", "Definition", "ParentIDs", "TreeNumbers",
               "ParentTreeNumbers", "Synonyms", "SlimMappings"]  # fmt: skip
    previous = ""
    for lineno, line in read_lines(path):
        if line.startswith("#"):
            if previous.strip() == "# Fields:":
                columns = line.lstrip("# ").split("\t")
            previous = line
            continue
        if not line.strip():
            continue
        values = line.split("\t")
        if len(values) < 2 or len(values) > len(columns):
            raise _malformed(path, lineno, f"expected up to {len(columns)} tab-separated columns", line)
        row = dict(zip(columns, values))
        name = row[columns[0]].strip()
        cid = row[columns[1]].strip()
        if not name or not cid:
            raise _malformed(path, lineno, "empty name or id", line)
        alt_key = next((c for c in columns if c.startswith("Alt")), None)
        concept = Concept(
            cid,
            name,
            alt_ids=_split(row.get(alt_key, "")) if alt_key else (),
            parents=_split(row.get("ParentIDs", "")),
            definition=row.get("Definition", "").strip(),
            types=_split(row.get("SlimMappings", "")),
        )
        yield concept, list(_split(row.get("Synonyms", "")))


def read_pipe_dictionary(path: str | Path) -> Iterator[Record]:
    """The MEDIC 2012 / BioSyn format: `ID[|ALT...]||name[|synonym...]`, one or more lines per concept.

    MEDIC writes OMIM ids as bare numbers; they are given the `OMIM:` prefix the corpora and CTD use. The first
    MeSH-like id (C/D + digits) is the concept id, since some lines list an OMIM id first.
    """
    path = Path(path)
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        ids_part, sep, names_part = line.partition("||")
        ids = [("OMIM:" + i if i.isdigit() else i) for i in _split(ids_part)]
        names = list(_split(names_part))
        if not sep or not ids or not names:
            raise _malformed(path, lineno, "expected 'ID||name'", line)
        primary = next((i for i in ids if re.fullmatch(r"(MESH:)?[CD]\d+", i)), ids[0])
        alt = tuple(i for i in ids if i != primary)
        yield Concept(primary, names[0], alt_ids=alt), names[1:]


def read_jsonl(path: str | Path) -> Iterator[Record]:
    """scispacy's KB JSONL: `{"concept_id", "canonical_name", "aliases", "types", "definition"}` per line."""
    path = Path(path)
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        try:
            obj = srsly.json_loads(line)
            concept = Concept(
                str(obj["concept_id"]),
                str(obj["canonical_name"]),
                types=tuple(obj.get("types") or ()),
                definition=obj.get("definition") or "",
                parents=tuple(obj.get("parents") or ()),
                alt_ids=tuple(obj.get("alt_ids") or ()),
            )
            aliases = [str(a) for a in obj.get("aliases") or ()]
        except (ValueError, KeyError, TypeError) as e:
            raise _malformed(path, lineno, f"{type(e).__name__}: {e}", line) from None
        yield concept, aliases


_OBO_QUOTED = re.compile(r'^"((?:[^"\\]|\\.)*)"')


def read_obo(path: str | Path) -> Iterator[Record]:
    """OBO 1.2/1.4 `[Term]` stanzas: id, name, synonym, alt_id, is_a, def, namespace; obsolete terms skipped."""
    path = Path(path)
    term: dict | None = None

    def finish(t: dict | None) -> Iterator[Record]:
        if t and not t["skip"] and t.get("id") and not t.get("obsolete"):
            if not t.get("name"):
                raise _malformed(path, t["line"], "term without a name", t["id"])
            concept = Concept(t["id"], t["name"], tuple(t["alt"]), tuple(t["parents"]), t["def"], tuple(t["types"]))
            yield concept, t["synonyms"]

    for lineno, line in read_lines(path):
        line = line.strip()
        if line.startswith("["):
            yield from finish(term)
            term = {"line": lineno, "alt": [], "parents": [], "synonyms": [], "types": [], "def": ""}
            term["skip"] = line != "[Term]"
            continue
        if not line or line.startswith("!"):
            continue
        tag, sep, value = line.partition(":")
        if tag == "id" and (term is None or "id" in term):  # else merged into the term before it
            raise _malformed(path, lineno, "an 'id' outside a stanza of its own: its [Term] header is missing", line)
        if term is None or term["skip"]:
            if tag == "id":
                term["id"] = value.strip()
            continue
        if not sep:
            raise _malformed(path, lineno, "expected 'tag: value'", line)
        value = value.strip()
        if tag in ("synonym", "def"):
            m = _OBO_QUOTED.match(value)
            if not m:
                raise _malformed(path, lineno, f"{tag} value must be quoted", line)
            text = m.group(1).replace('\\"', '"')
            term["synonyms"].append(text) if tag == "synonym" else term.__setitem__("def", text)
        elif tag == "id":
            term["id"] = value
        elif tag == "name":
            term["name"] = value
        elif tag == "alt_id":
            term["alt"].append(value)
        elif tag == "is_a":
            term["parents"].append(value.split("!")[0].strip())
        elif tag == "namespace":
            term["types"].append(value)
        elif tag == "is_obsolete":
            term["obsolete"] = value == "true"
    yield from finish(term)


def read_mrconso(
    path: str | Path, sources: Iterable[str] = (), languages: Iterable[str] = ("ENG",)
) -> Iterator[Record]:
    """UMLS `MRCONSO.RRF`, grouped by CUI (the file is sorted by CUI). Keeps rows whose SAB is in `sources`
    (all when empty) and whose LAT is in `languages`; the preferred name is the first row with TS=P, STT=PF,
    ISPREF=Y, else the first kept row."""
    path = Path(path)
    sources, languages = set(sources), set(languages)
    cui, names, preferred = None, [], None

    def finish() -> Iterator[Record]:
        if cui and names:
            canonical = preferred or names[0]
            yield Concept(cui, canonical), [n for n in names if n != canonical]

    for lineno, line in read_lines(path):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 15:
            raise _malformed(path, lineno, "expected at least 15 '|'-separated MRCONSO fields", line)
        if (sources and row[11] not in sources) or (languages and row[1] not in languages):
            continue
        if row[0] != cui:
            yield from finish()
            cui, names, preferred = row[0], [], None
        names.append(row[14])
        if preferred is None and row[2] == "P" and row[4] == "PF" and row[6] == "Y":
            preferred = row[14]
    yield from finish()


READERS = {
    "ctd": read_ctd_tsv,
    "medic": read_pipe_dictionary,
    "id_name": read_pipe_dictionary,
    "jsonl": read_jsonl,
    "obo": read_obo,
    "mrconso": read_mrconso,
}


def guess_format(path: str | Path) -> str:
    name = Path(path).name.lower().removesuffix(".gz")
    if name.endswith(".tsv"):
        return "ctd"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".obo"):
        return "obo"
    if name.endswith(".rrf"):
        return "mrconso"
    return "medic"


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
    if format == "mrconso":
        records = read_mrconso(path, mrconso_sources, mrconso_languages)
    else:
        records = READERS[format](path)
    kb = KnowledgeBase.from_records(records, normalizer)
    if not len(kb):
        raise ConceptNormError(Errors.E983.format(path=path, fmt=format))
    return kb
