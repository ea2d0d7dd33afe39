"""Issue 15, items 2 and 9: every file of a saved pipeline, truncated, flipped or deleted in turn, fails to load with
the package's error naming that file; a flipped bit in the saved KB no longer loads a different KB silently.

The pipeline carries its encoder (a 1-layer random BERT with the MiniLM tokenizer, saved from a local directory),
so its weights, tokenizer and config files are among the files checked."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import spacy

from spacy_conceptnorm.encoder import NameEncoder
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.kb import load_kb
from spacy_conceptnorm.util import SKIP_CHECKSUMS

from .conftest import FIXTURES

OURS = ("concept_normalizer", "composite_splitter", "abbreviation_resolver")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_bert) -> Path:
    path = tmp_path_factory.mktemp("faults") / "pipeline"
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_resolver")
    nlp.add_pipe("composite_splitter")
    normalizer = nlp.add_pipe("concept_normalizer", config={"encoder": {"model": str(tiny_bert)}})
    lines = (FIXTURES / "medic_sample.txt").read_text().splitlines()
    kb_file = path.parent / "medic.txt"  # a tenth of the sample: quick to encode
    kb_file.write_text("\n".join(line for i, line in enumerate(lines) if i % 10 == 0) + "\n")
    normalizer.initialize(nlp=nlp, kb=load_kb(kb_file))
    nlp.get_pipe("composite_splitter").set_known_names(["breast cancer"])
    nlp.to_disk(path)
    return path


def our_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] in OURS)


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # one bit flipped in the middle
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :])


def load_and_use(nlp, root: Path, file: Path) -> None:
    """Load the component that owns `file` from `root` (what `spacy.load` does for it), then run the pipeline:
    the encoder loads on first use."""
    owner = file.relative_to(root).parts[0]
    nlp.get_pipe(owner).from_disk(root / owner)
    doc = nlp.make_doc("Familial breast cancer.")
    doc.ents = [doc.char_span(9, 22, label="Disease")]
    nlp(doc)


def test_the_pipeline_saves_its_encoder_and_checksums(saved):
    names = {p.relative_to(saved).as_posix() for p in our_files(saved)}
    for name in ("checksums.json", "kb", "encoder/model.safetensors", "encoder/tokenizer.json", "encoder/config.json"):
        assert f"concept_normalizer/{name}" in names
    assert "composite_splitter/names.json" in names
    nlp = spacy.load(saved)
    load_and_use(nlp, saved, saved / "concept_normalizer" / "kb")
    kb_file = saved / "concept_normalizer" / "kb"
    original = kb_file.read_bytes()
    corrupt(kb_file, "flip")
    try:
        with pytest.raises(ConceptNormError, match="concept_normalizer/kb is truncated or corrupt"):
            spacy.load(saved)
    finally:
        kb_file.write_bytes(original)


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_every_file_corrupted_in_turn_is_named(saved, tmp_path, how):
    copy = tmp_path / "pipeline"
    shutil.copytree(saved, copy)
    nlp = spacy.load(copy)
    for file in our_files(copy):
        original = file.read_bytes()
        corrupt(file, how)
        with pytest.raises(ConceptNormError) as e:
            load_and_use(nlp, copy, file)
        assert str(file) in str(e.value), (file, how)
        file.write_bytes(original)


def test_without_checksums_truncated_files_are_still_named(saved, tmp_path, monkeypatch):
    monkeypatch.setenv(SKIP_CHECKSUMS, "1")
    copy = tmp_path / "pipeline"
    shutil.copytree(saved, copy)
    nlp = spacy.load(copy)
    for file in our_files(copy):
        if file.name in ("checksums.json", "vocab.txt"):  # not read once the checks are off; the fast tokenizer
            continue
        original = file.read_bytes()
        corrupt(file, "truncate")
        with pytest.raises(ConceptNormError) as e:
            load_and_use(nlp, copy, file)
        assert file.name in str(e.value), (file, str(e.value))
        file.write_bytes(original)


def test_a_flipped_bit_in_a_concept_id_no_longer_loads_another_kb(saved, tmp_path, monkeypatch):
    copy = tmp_path / "pipeline"
    shutil.copytree(saved, copy)
    kb_file = copy / "concept_normalizer" / "kb"
    data = kb_file.read_bytes()
    at = data.index(b"C567452")  # "Lymphedema, Hereditary, IB" becomes C567453 (one bit: 2 -> 3)
    kb_file.write_bytes(data[: at + 6] + bytes([data[at + 6] ^ 0x01]) + data[at + 7 :])
    with pytest.raises(ConceptNormError, match=r"concept_normalizer/kb is truncated or corrupt: its checksum"):
        spacy.load(copy)
    monkeypatch.setenv(SKIP_CHECKSUMS, "1")  # what the checks prevent: another KB, loaded without a word
    with pytest.raises(ConceptNormError, match=r"kb: the file is truncated or corrupt.*checksum"):
        spacy.load(copy)  # the KB's own crc32 of its tables (format 2) refuses it too
    monkeypatch.delenv(SKIP_CHECKSUMS)
    normalizer = spacy.load(saved).get_pipe("concept_normalizer")
    rng = np.random.default_rng(0)
    for _ in range(50):  # random bit flips: each one refused
        at = int(rng.integers(len(data)))
        kb_file.write_bytes(data[:at] + bytes([data[at] ^ (1 << int(rng.integers(8)))]) + data[at + 1 :])
        with pytest.raises(ConceptNormError, match="concept_normalizer/kb"):
            normalizer.from_disk(copy / "concept_normalizer")


def test_a_corrupt_encoder_directory_names_the_file(tiny_bert, tmp_path):
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        copy = tmp_path / name
        shutil.copytree(tiny_bert, copy)
        corrupt(copy / name, "truncate")
        with pytest.raises(ConceptNormError, match=rf"\[E101\].*{name} is truncated or corrupt"):
            NameEncoder(str(copy)).encode(["liver disease"])


def test_a_checksum_list_deleted_or_corrupt_is_refused(saved, tmp_path):
    copy = tmp_path / "pipeline"
    shutil.copytree(saved, copy)
    manifest = copy / "concept_normalizer" / "checksums.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"kb": "', '"kb": "0', 1))
    with pytest.raises(ConceptNormError, match=r"\[E981\].*corrupt"):
        spacy.load(copy)
    os.remove(manifest)
    with pytest.raises(ConceptNormError, match=r"\[E981\].*missing"):
        spacy.load(copy)
