"""Build the files of the whole-note set (dev.jsonl, heldout.jsonl, ...) from the annotators' files.

    python docs/clinical_notes/whole/build.py ANNOTATIONS_DIR NOTES_DIR SPLIT_FILE MEDIC_FILE

ANNOTATIONS_DIR holds one `<note>.jsonl` per note (`note`, `start`, `end`, `span`, `status` a line), NOTES_DIR the
notes as published (`<note>.txt`), SPLIT_FILE a `<part><TAB>note` line per note: each part is written to
`<part>.jsonl` beside this script, the notes in order of their ids. Each output line is one note
in the format of `evaluate-assertion` (`{"note", "text", "spans": [{"start", "end", "status", "id"}, ...]}`), each
span with the MEDIC id where its text is exactly one MEDIC 2012 concept's name or synonym, case aside (a name of
several concepts has none, nor has a short form: in capitals of up to four characters, or an item of a slash list
of shorthand), as the annotation rules of docs/clinical_notes/README.md and whole/README.md say.
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from spacy_conceptnorm.kb.formats import read_pipe_dictionary

STATUSES = {"negated", "family", "hypothetical", "uncertain", "historical", "affirmed"}


def medic_names(path: Path) -> dict[str, set[str]]:
    """Lower-cased name or synonym -> the ids of the concepts that have it, as the knowledge base reads MEDIC
    (`kb.formats.read_pipe_dictionary`: the first MeSH id of a line, an OMIM-only concept as `OMIM:<number>`)."""
    names: dict[str, set[str]] = defaultdict(set)
    for concept, synonyms in read_pipe_dictionary(path):
        for name in (concept.canonical_name, *synonyms):
            names[name.lower()].add(concept.concept_id)
    return names


def concept_id(text: str, start: int, end: int, names: dict[str, set[str]]) -> str | None:
    """The MEDIC id of the span `text[start:end]`, or None: for a name of several concepts, a short form in
    capitals of up to four characters, and an item of a slash list of shorthand ("cp" in "denies n/v/cp/sob": chest
    pain, not what MEDIC's "CP" names)."""
    span = text[start:end]
    in_list = len(span) <= 4 and "/" in (text[start - 1 : start] + text[end : end + 1])
    if in_list or re.fullmatch(r"[A-Z0-9]{1,4}s?", span):
        return None
    ids = names.get(span.lower(), set())
    return next(iter(ids)) if len(ids) == 1 else None


def main(annotations: Path, notes: Path, split_file: Path, medic: Path) -> None:
    names = medic_names(medic)
    split = dict(line.split("\t")[::-1] for line in split_file.read_text().split("\n") if line.strip())
    out: dict[str, list[dict]] = defaultdict(list)
    for note, part in sorted(split.items()):
        text = (notes / f"{note}.txt").read_text(encoding="utf-8")
        spans = []
        for number, raw in enumerate((annotations / f"{note}.jsonl").read_text().splitlines(), 1):
            if not raw.strip():
                continue
            record = json.loads(raw)
            start, end, status = record["start"], record["end"], record["status"]
            if text[start:end] != record["span"] or status not in STATUSES:
                raise SystemExit(f"{annotations / f'{note}.jsonl'}:{number}: offsets or status do not match")
            span = {"start": start, "end": end, "status": status}
            cid = concept_id(text, start, end, names)
            if cid:
                span["id"] = cid
            spans.append(span)
        out[part].append({"note": note, "text": text, "spans": spans})
    here = Path(__file__).parent
    for part, records in out.items():
        lines = [json.dumps(record, ensure_ascii=False) for record in records]
        (here / f"{part}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{part}: {sum(len(r['spans']) for r in records)} spans in {len(records)} notes")


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:5]))
