"""Ontology file formats, each read as a stream of (concept, synonyms) records.

Formats: CTD TSV (MEDIC diseases, chemicals), the MEDIC/BioSyn pipe format (`ID|ALT||name|synonym...`, also
`ID||name` dictionaries), scispacy-compatible JSONL, OBO and UMLS MRCONSO.RRF. A reader streams its file (`.gz`
allowed), never holding it whole, and a malformed line raises a ConceptNormError naming the file and line.
`knowledge_base.load_kb` builds a knowledge base from these records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import srsly

from ..errors import ConceptNormError, Errors
from ..io.files import read_lines
from .concept import Concept

Record = tuple[Concept, list[str]]  # a concept and its synonyms


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split("|") if v.strip())


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
    """The format a file's name suggests (`.tsv` CTD, `.jsonl`/`.json`, `.obo`, `.rrf` MRCONSO), else `medic`."""
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


def read_records(
    path: str | Path, format: str, mrconso_sources: Iterable[str] = (), mrconso_languages: Iterable[str] = ("ENG",)
) -> Iterator[Record]:
    """The records of an ontology file in one of the `READERS` formats (MRCONSO filtered by source and language)."""
    if format == "mrconso":
        return read_mrconso(path, mrconso_sources, mrconso_languages)
    return READERS[format](path)
