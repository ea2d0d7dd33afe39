"""Build dev.jsonl and heldout.jsonl of the whole-note set from the annotators' files.

    python docs/clinical_notes/whole/build.py ANNOTATIONS_DIR NOTES_DIR SPLIT_FILE MEDIC_FILE

ANNOTATIONS_DIR holds one `<note>.jsonl` per note (`note`, `start`, `end`, `span`, `status` a line), NOTES_DIR the
notes as published (`<note>.txt`), SPLIT_FILE a `dev|heldout<TAB>note` line per note. Each output line is one note
in the format of `evaluate-assertion` (`{"note", "text", "spans": [{"start", "end", "status", "id"}, ...]}`), each
span with the MEDIC id where its text is exactly one MEDIC 2012 concept's name or synonym, case aside (a name of
several concepts has none, nor has a short form in capitals of up to four characters), as the annotation rules of
docs/clinical_notes/README.md say.
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

STATUSES = {"negated", "family", "hypothetical", "uncertain", "historical", "affirmed"}


def medic_names(path: Path) -> dict[str, set[str]]:
    """Lower-cased name or synonym -> the ids of the MEDIC lines that hold it (the first id of each line)."""
    names: dict[str, set[str]] = defaultdict(set)
    for line in path.read_text(encoding="utf-8").splitlines():
        ids, _, terms = line.partition("||")
        if not terms:
            continue
        concept = ids.split("|")[0].removeprefix("MESH:")
        for term in terms.split("|"):
            if term.strip():
                names[term.strip().lower()].add(concept)
    return names


def concept_id(span: str, names: dict[str, set[str]]) -> str | None:
    if re.fullmatch(r"[A-Z0-9]{1,4}s?", span):
        return None
    ids = names.get(span.lower(), set())
    return next(iter(ids)) if len(ids) == 1 else None


def main(annotations: Path, notes: Path, split_file: Path, medic: Path) -> None:
    names = medic_names(medic)
    split = dict(line.split("\t")[::-1] for line in split_file.read_text().split("\n") if line.strip())
    out: dict[str, list[dict]] = {"dev": [], "heldout": []}
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
            cid = concept_id(record["span"], names)
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
