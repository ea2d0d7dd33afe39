"""Compatibility with release 0.2.0: its registered names are all still there, and a pipeline that 0.2.0's own
`assemble` saved loads with the current code and links identically (`benchmarks.compat`; the real case, MEDIC and
the NCBI-disease test set, is `python -m benchmarks.compat PIPELINE`).

The release's source comes from git history (`git archive`); outside a git checkout with that commit these tests
fail, saying so: CI runs from a clone."""

import importlib
import importlib.metadata
import json
import re
import shutil
from pathlib import Path

import pytest
import spacy
from spacy.util import registry

from benchmarks import compat
from spacy_conceptnorm.io.corpus import pubtator_to_docs

from .conftest import FIXTURES
from .fake_encoder import TrigramEncoder

ENCODER = "test_compat.trigram_encoder.v1"
REGISTERED = re.compile(r'@(registry\.\w+|Language\.factory|Language\.component)\(\s*"([^"]+)"')
# Run first in the release's process (beside a copy of fake_encoder.py): the same encoder under the same name
RELEASE_ENCODER = f'''
from spacy.util import registry
from fake_encoder import TrigramEncoder


class SavedTrigramEncoder(TrigramEncoder):
    def config(self):
        return {{}}


@registry.misc("{ENCODER}")
def make_trigram_encoder():
    return SavedTrigramEncoder()
'''


class SavedTrigramEncoder(TrigramEncoder):
    def config(self) -> dict:
        return {}  # nothing to save: the loaded pipeline makes its encoder from its config


@registry.misc(ENCODER)
def make_trigram_encoder() -> TrigramEncoder:
    return SavedTrigramEncoder()


def extract_release(dest: Path) -> Path:
    try:
        return compat.extract_release(dest)
    except compat.ReleaseUnavailable as e:
        pytest.fail(f"the 0.2.0 source tree could not be taken from git history: {e}", pytrace=False)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict:
    """0.2.0's pipeline without a recognizer (dictionary_matcher -> abbreviation_resolver -> composite_splitter ->
    concept_normalizer -> link_filter, from its configs/pipeline.cfg) over the MEDIC sample, with the train sample
    as domain synonyms and dictionary training docs and the trigram encoder, saved by 0.2.0's `assemble`; the test
    sample's docs as a DocBin, and what 0.2.0's code links in them, gold mentions and end to end."""
    tmp = tmp_path_factory.mktemp("compat")
    tree = extract_release(tmp / "release")
    shutil.copy(Path(__file__).parent / "fake_encoder.py", tmp / "fake_encoder.py")
    preload = [tmp / "release_encoder.py"]
    preload[0].write_text(RELEASE_ENCODER, encoding="utf-8")
    compat.release_config(tree, encoder={"@misc": ENCODER}).to_disk(tmp / "pipeline.cfg")
    train = str(FIXTURES / "ncbi_train_sample.txt")
    paths = ["--paths.kb", str(FIXTURES / "medic_sample.txt"), "--paths.synonyms", train, "--paths.train", train]
    assemble = ["cli", "assemble", str(tmp / "pipeline.cfg"), str(tmp / "pipeline"), "--no-clinical", *paths]
    done = compat.run_release(tree, assemble, preload, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    docs = compat.write_docs(pubtator_to_docs(spacy.blank("en"), FIXTURES / "ncbi_test_sample.txt"), tmp / "docs.spacy")
    args = ["link", str(tmp / "pipeline"), str(docs), str(tmp / "links.json"), "--modes", *compat.MODES]
    done = compat.run_release(tree, args, preload, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    links = json.loads((tmp / "links.json").read_text(encoding="utf-8"))
    return {"tree": tree, "pipeline": tmp / "pipeline", "docs": docs, "links": links}


def test_extracting_the_release_needs_git_history(tmp_path, monkeypatch):
    monkeypatch.setattr(compat, "REPO", tmp_path / "not-a-clone")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above it is found either
    (tmp_path / "not-a-clone").mkdir()
    with pytest.raises(compat.ReleaseUnavailable, match="not a git checkout"):
        compat.extract_release(tmp_path / "release")


def registered_in_source(root: Path) -> set[tuple[str, str]]:
    """(registry, name) of each `@registry.X("name")` and `@Language.factory("name")` in the package's source."""
    found = set()
    for path in (root / "spacy_conceptnorm").rglob("*.py"):
        for kind, name in REGISTERED.findall(path.read_text(encoding="utf-8")):
            found.add((kind, name))
    return found


def test_every_registered_name_of_the_release_is_still_registered(tmp_path):
    """Factories, architectures, misc functions, scorers, batchers, schedules: each name 0.2.0 declared as an entry
    point is still declared (in setup.cfg and in the installed package's metadata, which spaCy reads) and its target
    imports; each name 0.2.0 registered with a decorator is still registered by one."""
    tree = extract_release(tmp_path / "release")
    released = compat.declared_entry_points(tree / "setup.cfg")
    declared = compat.declared_entry_points(compat.REPO / "setup.cfg")
    for group, names in released.items():
        installed = {e.name: e.value for e in importlib.metadata.entry_points(group=group)}
        for name in names:
            target = declared.get(group, {}).get(name)
            assert target, f"{group} {name} (0.2.0: {names[name]}) is no longer declared in setup.cfg"
            assert installed.get(name) == target, (
                f"the installed metadata gives {group} {name} as {installed.get(name)}, setup.cfg as {target}: "
                "reinstall the package (pip install -e .)"
            )
            module, _, attribute = target.partition(":")
            assert callable(getattr(importlib.import_module(module), attribute)), (group, name, target)
    missing = registered_in_source(tree) - registered_in_source(compat.REPO)
    assert not missing, f"registered by 0.2.0, by nothing now: {sorted(missing)}"


def test_compare_counts_each_difference():
    ent = {"start": 0, "end": 4, "label": "Disease", "kb_id": "D1", "kb_ents": [["D1", 0.9], ["D2", 0.5]]}
    same = {**ent, "kb_ents": [["D1", 0.9 + 1e-7], ["D2", 0.5]]}
    reordered = {**ent, "start": 5, "end": 9, "kb_ents": [["D2", 0.9], ["D1", 0.5]]}
    old_only, new_only = {**ent, "start": 10, "end": 14}, {**ent, "start": 20, "end": 24}
    result = compat.compare([[ent, {**reordered, "kb_ents": ent["kb_ents"]}, old_only]], [[same, reordered, new_only]])
    assert (result["mentions"], result["same_kb_ents"], result["same_kb_id"]) == (3, 1, 2)
    assert len(result["differences"]) == 3  # the reordered candidates, the entity each side has alone
    assert result["max_score_diff"] == pytest.approx(1e-7)


@pytest.mark.slow  # 0.2.0's assemble and its linking, each in a fresh process: about 30 s
def test_a_pipeline_saved_by_0_2_0_links_the_same(release):
    old, tree = release["links"], release["tree"].resolve()
    assert Path(old["package"]).resolve().is_relative_to(tree)  # the release process ran the release's code
    assert old["version"] == "0.2.0"
    pipes = ["dictionary_matcher", "abbreviation_resolver", "composite_splitter", "concept_normalizer", "link_filter"]
    assert list(old["pipes"]) == pipes
    for name, where in old["pipes"].items():
        assert where.startswith("spacy_conceptnorm.") and f"({tree}/" in where, (name, where)

    new = compat.link_saved(release["pipeline"], release["docs"], compat.MODES)  # spacy_conceptnorm.load
    assert list(new["pipes"]) == pipes
    for name, where in new["pipes"].items():  # the current code
        assert where.startswith("spacy_conceptnorm.") and f"({compat.REPO}/spacy_conceptnorm/" in where, (name, where)
    for mode in compat.MODES:
        result = compat.compare(old[mode], new[mode])
        assert result["differences"] == [], mode
        assert result["same_kb_ents"] == result["same_kb_id"] == result["mentions"], mode
        assert result["mentions"] >= (53 if mode == "gold" else 20), (mode, result["mentions"])
    assert all(ent["kb_ents"] for doc in old["gold"] for ent in doc)  # every gold mention was linked
