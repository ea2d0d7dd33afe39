"""Every file of a saved pipeline, truncated, flipped or deleted in turn, fails to load with the package's error
naming that file; a flipped bit in the saved KB does not load a different KB silently. Our components' files are
checked by `spacy.load`; every file, spaCy's included, by `spacy_conceptnorm.load` of a pipeline written by
`spacy_conceptnorm.save`.

The pipeline carries its encoder (a 1-layer random BERT with the MiniLM tokenizer, saved from a local directory),
so its weights, tokenizer and config files are among the files checked."""

import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy.training import Example

from spacy_conceptnorm import load, save
from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.io.files import SKIP_CHECKSUMS
from spacy_conceptnorm.kb.knowledge_base import load_kb
from spacy_conceptnorm.ml.name_encoder import NameEncoder

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
    # hand-set weights of a ranker that reorders: its lexical index is saved and read too
    normalizer.ranker.weights = {"mean": np.zeros(3), "scale": np.ones(3), "coef": np.ones(3)}
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
    for name in (
        "checksums.json",
        "kb",
        "encoder/model.safetensors",
        "encoder/tokenizer.json",
        "encoder/config.json",
        "linker/models.json",
        "linker/lexical.msgpack",
    ):
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


def test_without_checksums_a_missing_lexical_index_of_a_reordering_ranker_is_named(saved, tmp_path, monkeypatch):
    monkeypatch.setenv(SKIP_CHECKSUMS, "1")
    copy = tmp_path / "pipeline"
    shutil.copytree(saved, copy)
    lexical = copy / "concept_normalizer" / "linker" / "lexical.msgpack"
    lexical.unlink()
    with pytest.raises(ConceptNormError, match="E302") as e:
        spacy.load(copy)
    assert str(lexical) in str(e.value)


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


# --- the whole pipeline, spaCy's files included: spacy_conceptnorm.save / load -------------------------------------
@pytest.fixture(scope="module")
def whole(tmp_path_factory, saved) -> Path:
    """`saved` with spaCy's `ner` added (its weights in ner/model), written by `spacy_conceptnorm.save`."""
    nlp = spacy.load(saved)
    ner = nlp.add_pipe("ner", first=True)
    doc = nlp.make_doc("Familial breast cancer.")
    ner.initialize(lambda: [Example.from_dict(doc, {"entities": [(9, 22, "Disease")]})], nlp=nlp)
    path = tmp_path_factory.mktemp("whole") / "pipeline"
    save(nlp, path)
    return path


def test_save_lists_spacys_files_and_each_components_own_list(whole):
    listed = set(json.loads((whole / "checksums.json").read_text())["files"])
    for name in ("config.cfg", "tokenizer", "vocab/strings.json", "ner/model", "ner/moves",
                 "composite_splitter/names.json", "concept_normalizer/checksums.json"):  # fmt: skip
        assert name in listed
    assert not any(name.startswith("concept_normalizer/") for name in listed - {"concept_normalizer/checksums.json"})
    assert "meta.json" not in listed  # `spacy package` rewrites it
    nlp = load(whole)
    assert nlp.pipe_names[0] == "ner" and "concept_normalizer" in nlp.pipe_names


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_every_file_of_a_saved_pipeline_corrupted_in_turn_is_named_by_load(whole, tmp_path, how):
    copy = tmp_path / "pipeline"
    shutil.copytree(whole, copy)
    files = sorted(p for p in copy.rglob("*") if p.is_file())
    assert len(files) > 20
    for file in files:
        original = file.read_bytes()
        corrupt(file, how)
        if file == copy / "checksums.json" and how == "delete":
            load(copy)  # without its root list the pipeline is one saved by nlp.to_disk: it loads
        elif file == copy / "meta.json" and how == "flip":
            pass  # not listed (spacy package rewrites it): a flip that still parses loads; a broken one is named
        else:
            with pytest.raises(ConceptNormError) as e:
                load(copy)
            assert str(file) in str(e.value), (file, how, str(e.value))
        file.write_bytes(original)


@pytest.mark.parametrize(
    "name,named",  # the file, or the part's directory where spaCy's reader is compiled (Cython: no frame to read)
    [("tokenizer", "tokenizer"), ("vocab/strings.json", "vocab/strings.json"), ("ner/model", "ner"),
     ("ner/cfg", "ner/cfg"), ("config.cfg", "config.cfg"), ("meta.json", "meta.json")],
)  # fmt: skip
def test_without_a_root_list_spacys_files_that_fail_to_load_are_named(whole, tmp_path, name, named):
    copy = tmp_path / "pipeline"
    shutil.copytree(whole, copy)
    (copy / "checksums.json").unlink()  # as nlp.to_disk saves it
    corrupt(copy / name, "truncate")
    with pytest.raises(ConceptNormError, match=r"\[E988\]") as e:
        load(copy)
    assert f"it failed reading {copy / named} (" in str(e.value)
    with pytest.raises(Exception) as raw:  # what spacy.load itself says: no file named
        spacy.load(copy)
    assert not isinstance(raw.value, ConceptNormError)


def test_a_pipeline_saved_again_by_to_disk_warns_that_its_root_list_is_stale(whole, tmp_path):
    copy = tmp_path / "pipeline"
    shutil.copytree(whole, copy)
    nlp = load(copy)
    nlp.get_pipe("ner").add_label("Chemical")  # spaCy's files change, and the root list no longer knows them
    nlp.to_disk(copy)
    with pytest.warns(UserWarning, match=r"W981.*concept_normalizer"):
        reloaded = load(copy)
    assert "Chemical" in reloaded.get_pipe("ner").labels
    save(reloaded, copy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(copy)


def test_an_installed_pipeline_package_is_checked_in_its_data_directory(whole, tmp_path, monkeypatch):
    """A package laid out as `spacy package` makes it (its data directory a copy of the pipeline, whose meta.json
    the packaging rewrites), installed on sys.path with its distribution metadata."""
    name, version = "en_cn_faults_test", "0.1.0"
    package = tmp_path / "site" / name
    data = package / f"{name}-{version}"
    shutil.copytree(whole, data)
    meta = {**json.loads((whole / "meta.json").read_text()), "name": "cn_faults_test", "version": version}
    for where in (package, data):  # spacy package writes both
        (where / "meta.json").write_text(json.dumps(meta))
    (package / "__init__.py").write_text(
        "from spacy.util import load_model_from_init_py\n\n\ndef load(**overrides):\n"
        "    return load_model_from_init_py(__file__, **overrides)\n"
    )
    info = tmp_path / "site" / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        assert "concept_normalizer" in load(name).pipe_names  # the rewritten meta.json is no damage
        corrupt(data / "vocab" / "strings.json", "flip")
        with pytest.raises(ConceptNormError, match=r"\[E980\]") as e:
            load(name)
        assert str(data / "vocab" / "strings.json") in str(e.value)
    finally:
        sys.modules.pop(name, None)
