import gzip
import os

import pytest
import srsly

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb.knowledge_base import DOMAIN, ONTOLOGY, SOURCE_BITS, Concept, KnowledgeBase, load_kb


def test_medic_2012_loader_keeps_mesh_primary_and_omim_alternatives(kb):
    # `114480|D001943||Breast Neoplasms|...`: the OMIM id comes first in the file, MeSH is the concept id
    assert "D001943" in kb.concepts
    concept = kb.concepts["D001943"]
    assert concept.canonical_name == "Breast Neoplasms"
    assert "OMIM:114480" in concept.alt_ids
    assert kb.resolve("OMIM:114480") == "D001943"
    assert kb.resolve("MESH:D001943") == "D001943"
    assert kb.resolve("D999999") is None


def test_names_are_normalized_and_shared_names_keep_every_concept():
    kb = KnowledgeBase()
    kb.add_concept(Concept("C1", "No appetite"), ["Anorexia"])
    kb.add_concept(Concept("C2", "Anorexia nervosa"), ["ANOREXIA"])
    assert sorted(kb.concepts_for("anorexia")) == ["C1", "C2"]
    assert kb.concepts_for("no appetite") == ["C1"]
    assert kb.surface("no appetite") == "No appetite"


def test_add_and_remove_domain_names():
    kb = KnowledgeBase()
    kb.add_concept(Concept("D1", "Colorectal Neoplasms"))
    new, unknown = kb.add_names([("CRC", "D1"), ("crc", "D1"), ("x", "NOPE")])
    assert new == ["crc"] and unknown == ["NOPE"]
    assert kb.concepts_for("crc", SOURCE_BITS[DOMAIN]) == ["D1"]
    assert kb.concepts_for("crc", SOURCE_BITS[ONTOLOGY]) == []
    assert kb.remove_names([("CRC", "D1")]) == ["crc"]
    assert kb.concepts_for("crc") == []
    # removing a domain link keeps the ontology link of the same name
    kb.add_names([("Colorectal Neoplasms", "D1")])
    kb.remove_names([("colorectal neoplasms", None)])
    assert kb.concepts_for("colorectal neoplasms") == ["D1"]


def test_bad_pairs_are_rejected():
    kb = KnowledgeBase()
    with pytest.raises(ConceptNormError, match="pairs"):
        kb.add_names(["just a string"])


def test_ctd_tsv_loader_reads_hierarchy_and_alt_ids(fixtures, tmp_path):
    kb = load_kb(fixtures / "ctd_diseases_sample.tsv")
    breast = kb.concepts["MESH:D001943"]
    assert breast.parents == ("MESH:D001941", "MESH:D009371")
    assert "OMIM:114480" in breast.alt_ids
    assert kb.resolve("D001943") == "MESH:D001943"
    assert kb.resolve("OMIM:114480") == "MESH:D001943"
    assert breast.definition.startswith("Tumors or cancer")
    # the gzip-compressed file gives the same KB
    gz = tmp_path / "ctd.tsv.gz"
    gz.write_bytes(gzip.compress((fixtures / "ctd_diseases_sample.tsv").read_bytes()))
    assert load_kb(gz).concepts == kb.concepts


def test_id_name_dictionary_merges_lines_of_one_concept(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("MESH:D001||Disease One\nMESH:D001||first disease\nOMIM:123||Other\n")
    kb = load_kb(path, format="id_name")
    assert len(kb) == 2
    assert kb.concepts_for("first disease") == ["MESH:D001"]
    assert kb.resolve("D001") == "MESH:D001"


def test_jsonl_loader_scispacy_shape(tmp_path):
    path = tmp_path / "kb.jsonl"
    path.write_text(
        '{"concept_id": "C0011849", "canonical_name": "Diabetes Mellitus", "aliases": ["DM", "diabetes"],'
        ' "types": ["T047"], "definition": "A metabolic disease."}\n'
    )
    kb = load_kb(path)
    assert kb.concepts["C0011849"].types == ("T047",)
    assert kb.concepts_for("dm") == ["C0011849"]


def test_obo_loader(tmp_path):
    path = tmp_path / "mini.obo"
    path.write_text(
        "format-version: 1.2\n\n[Term]\nid: DOID:1612\nname: breast cancer\n"
        'def: "A thoracic cancer." [url:x]\nsynonym: "mammary cancer" EXACT []\nis_a: DOID:3459 ! breast carcinoma\n'
        "alt_id: DOID:9999\n\n[Term]\nid: DOID:0000\nname: old term\nis_obsolete: true\n\n"
        "[Typedef]\nid: part_of\nname: part of\n"
    )
    kb = load_kb(path)
    assert list(kb.concepts) == ["DOID:1612"]
    concept = kb.concepts["DOID:1612"]
    assert concept.parents == ("DOID:3459",) and concept.definition == "A thoracic cancer."
    assert kb.concepts_for("mammary cancer") == ["DOID:1612"]
    assert kb.resolve("DOID:9999") == "DOID:1612"


def test_mrconso_loader_filters_sources_and_languages(tmp_path):
    rows = [
        "C0011849|ENG|P|L1|PF|S1|Y|A1||||MSH|MH|D003920|Diabetes Mellitus|0|N||",
        "C0011849|ENG|S|L2|VO|S2|N|A2||||SNOMEDCT_US|SY|73211009|DM - Diabetes mellitus|0|N||",
        "C0011849|FRE|P|L3|PF|S3|Y|A3||||MSHFRE|MH|D003920|Diabète|0|N||",
        "C0020538|ENG|P|L4|PF|S4|Y|A4||||MSH|MH|D006973|Hypertension|0|N||",
    ]
    path = tmp_path / "MRCONSO.RRF"
    path.write_text("\n".join(rows) + "\n")
    kb = load_kb(path, mrconso_sources=["MSH"])
    assert sorted(kb.concepts) == ["C0011849", "C0020538"]
    assert kb.concepts["C0011849"].canonical_name == "Diabetes Mellitus"
    assert kb.concepts_for("dm diabetes mellitus") == []  # SNOMED row filtered out
    assert kb.concepts_for("diabete") == []  # French row filtered out
    everything_english = load_kb(path)  # the SNOMED row kept, the French one still left out
    assert everything_english.concepts_for("dm diabetes mellitus") == ["C0011849"]
    assert everything_english.names() == ["diabetes mellitus", "dm diabetes mellitus", "hypertension"]


@pytest.mark.parametrize(
    "fmt,content,line",
    [
        ("medic", "D001||Good\nno separator here\n", 2),
        ("jsonl", '{"concept_id": "C1", "canonical_name": "x"}\n{"concept_id": "C2"}\n', 2),
        ("ctd", "A\tMESH:D1\nonlyone\n", 2),
        ("obo", "[Term]\nid: X:1\nname: x\nsynonym: unquoted EXACT []\n", 4),
        ("mrconso", "C1|ENG|P\n", 1),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, fmt, content, line):
    path = tmp_path / f"bad.{fmt}"
    path.write_text(content)
    with pytest.raises(ConceptNormError, match=rf"bad\.{fmt}:{line}: malformed"):
        load_kb(path, format=fmt)


def test_wrong_encoding_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("D001||Good\nD002||Sj\u00f6gren syndrome\n".encode("latin-1"))
    with pytest.raises(ConceptNormError, match=r"latin1\.txt:2.*utf-8"):
        load_kb(path)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(ConceptNormError, match="not found"):
        load_kb(tmp_path / "nope.txt")
    (tmp_path / "x.txt").write_text("D1||x\n")
    with pytest.raises(ConceptNormError, match="Unknown knowledge base format"):
        load_kb(tmp_path / "x.txt", format="csv")


def test_round_trip_and_corrupt_files(kb, tmp_path):
    kb.add_names([("CRC", "OMIM:114500")])
    path = tmp_path / "medic.kb"
    kb.to_disk(path)
    loaded = load_kb(path)
    assert loaded.concepts == kb.concepts
    assert loaded.names() == kb.names()
    assert loaded.concepts_for("crc", SOURCE_BITS[DOMAIN]) == ["D015179"]
    assert loaded.resolve("OMIM:114480") == "D001943"
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left no temporary file
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a plain file's permissions, not mkstemp's 0600

    truncated = tmp_path / "truncated.kb"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConceptNormError, match="truncated or corrupt"):
        load_kb(truncated)
    foreign = tmp_path / "foreign.kb"
    foreign.write_bytes(b"\x81\xa6format\xa5other")
    with pytest.raises(ConceptNormError, match="not a valid saved knowledge base"):
        load_kb(foreign)


def test_a_saved_kb_of_another_format_version_is_refused(tmp_path):
    """Only the current saved format is read; any other version tag gets E003 naming the file."""
    old = {"format": "spacy_conceptnorm.kb", "version": 1, "normalizer": {}, "concepts": [], "names": []}
    (tmp_path / "old.kb").write_bytes(srsly.msgpack_dumps(old))
    with pytest.raises(
        ConceptNormError, match=r"\[E003\].*old\.kb.*'spacy_conceptnorm\.kb/1'.*'spacy_conceptnorm\.kb/2'"
    ):
        load_kb(tmp_path / "old.kb")
