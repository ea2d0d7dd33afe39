"""The `spacy project` workflow (project.yml), the NER and pipeline configs, and the preprocess and assemble
commands: the project file validates, every command it runs exists and takes the options it is given, every
dependency is produced earlier or is data or a config, and each config builds a pipeline."""

from __future__ import annotations

import configparser
import copy
import importlib
import json
from pathlib import Path

import pytest
import spacy
import srsly
import typer.main
from spacy.tokens import DocBin
from spacy.training import Example
from spacy.util import load_config, load_model_from_config, registry
from typer.testing import CliRunner
from weasel.schemas import ProjectConfigSchema, validate
from weasel.util import split_command, substitute_project_variables, validate_project_commands

from spacy_conceptnorm.cli import app
from spacy_conceptnorm.io.corpus import read_pubtator
from spacy_conceptnorm.ml.name_encoder import packaged_model_path

ROOT = Path(__file__).parent.parent
CONFIGS = ROOT / "configs"
FIXTURES = Path(__file__).parent / "fixtures"
ALL = [
    "preprocess", "kb", "train", "train-ner", "assemble", "train-ranker", "calibrate", "evaluate",
    "package", "train-ner-clinical", "clinical",
]  # fmt: skip
# our CLI commands whose options are checked against the script lines
CHECKED = {
    "preprocess", "build-kb", "train", "train-bne", "assemble", "train-ranker", "calibrate", "evaluate",
}  # fmt: skip
runner = CliRunner()


@pytest.fixture(scope="module")
def raw_project() -> dict:
    return srsly.read_yaml(ROOT / "project.yml")


@pytest.fixture(scope="module")
def project(raw_project) -> dict:
    # load_project_config would also create the project's directories; this interpolates only
    return substitute_project_variables(copy.deepcopy(raw_project))


@pytest.fixture(scope="module")
def commands(project) -> dict[str, dict]:
    return {c["name"]: c for c in project["commands"]}


def _overrides(argv: list[str]) -> list[str]:
    """The dotted config overrides of a command line: --paths.train x -> paths.train."""
    return [a[2:] for a in argv if a.startswith("--") and "." in a[2:]]


def _config_has(config, dotted: str) -> bool:
    node = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _assert_config_takes_overrides(argv: list[str]) -> None:
    """The config a `spacy train`/`assemble` line names (argv[4]) has every key the line overrides."""
    config = load_config(ROOT / argv[4], interpolate=False)
    for key in _overrides(argv):
        assert _config_has(config, key), f"{' '.join(argv)}: {argv[4]} has no {key}"


def _under(path: str, prefix: str) -> bool:
    path, prefix = Path(path), Path(prefix.rstrip("/"))
    return path == prefix or prefix in path.parents


# --- project.yml ------------------------------------------------------------------------------------------------


def test_project_yml_validates_with_weasels_schema(raw_project, project):
    assert validate(ProjectConfigSchema, raw_project) == []
    validate_project_commands(raw_project)  # exits on unknown workflow steps or duplicate names
    assert project["workflows"]["all"] == ALL
    assert project["vars"]["ner"] == "trf"  # the recognizer chosen on dev; `--vars.ner fast` for the CNN
    assert project["vars"]["data"] == "../shared/data" and project["vars"]["gpu_id"] == -1
    assert not any("${" in str(c) for c in project["commands"])  # every variable was substituted


def test_assets_are_extra_downloads_only(project):
    assets = project["assets"]
    assert {Path(a["dest"]).name for a in assets} >= {
        "NCBItrainset_corpus.zip", "NCBIdevelopset_corpus.zip", "NCBItestset_corpus.zip", "medic_06Jul2012.txt",
    }  # fmt: skip
    # marked extra: a plain `spacy project assets` fetches nothing (the data are read from ../shared/data here)
    assert all(a.get("extra") is True and a["url"].startswith("http") for a in assets)
    # unpacked, the downloads have the layout the commands expect under --vars.data assets
    unpacked = substitute_project_variables(
        copy.deepcopy(srsly.read_yaml(ROOT / "project.yml")), overrides={"vars.data": "assets"}
    )
    unpack = next(c for c in project["commands"] if c["name"] == "unpack-assets")
    preprocess = next(c for c in unpacked["commands"] if c["name"] == "preprocess")
    assert set(preprocess["deps"]) == set(unpack["outputs"])


def test_every_command_line_runs_an_existing_command_with_known_options(project):
    from spacy.cli import app as spacy_app

    ours = typer.main.get_command(app).commands
    spacys = typer.main.get_command(spacy_app).commands
    for command in project["commands"]:
        for line in command["script"]:
            argv = split_command(line)
            assert argv[0] == "python", line  # weasel runs `python` as the current interpreter
            if argv[1] == "-c":
                compile(argv[2], line, "exec")
                continue
            assert argv[1] == "-m", line
            if argv[2] == "zipfile":
                continue
            assert argv[2] in ("spacy", "spacy_conceptnorm"), line
            cli = spacys if argv[2] == "spacy" else ours
            name = argv[3]
            assert name in cli, f"{line}: no command {name!r}"
            if argv[2] == "spacy_conceptnorm" and name not in CHECKED:
                continue
            command, rest = cli[name], argv[4:]
            if hasattr(command, "commands"):  # a group: spacy init vectors ...
                assert rest[0] in command.commands, f"{line}: no command {name} {rest[0]!r}"
                command, rest = command.commands[rest[0]], rest[1:]
            options = {opt for p in command.params for opt in p.opts if opt.startswith("-")}
            for arg in rest:
                if arg.startswith("--") and "." not in arg:
                    assert arg in options, f"{line}: {name} has no option {arg}"
            if _overrides(argv):  # the config named on the line must have every overridden key
                assert cli[name].context_settings.get("ignore_unknown_options"), line
                _assert_config_takes_overrides(argv)


def test_every_dependency_is_data_a_config_or_an_earlier_output(project, commands):
    data = Path(project["vars"]["data"])
    assets = {a["dest"] for a in project["assets"]}
    produced: set[str] = set()
    for command in project["commands"]:
        for dep in command["deps"]:
            assert (
                data in Path(dep).parents
                or dep in assets
                or (_under(dep, "configs") and (ROOT / dep).is_file())
                or (_under(dep, "docs/clinical_notes") and (ROOT / dep).is_file())  # annotations in the repository
                or dep in produced
            ), f"{command['name']}: dependency {dep!r} is neither data, a config, annotations nor an earlier output"
        produced.update(command["outputs"])
    # in the workflow, each step's produced dependencies come from an earlier step of the workflow
    produced = set()
    for name in project["workflows"]["all"]:
        for dep in commands[name]["deps"]:
            if not (data in Path(dep).parents or _under(dep, "configs") or _under(dep, "docs/clinical_notes")):
                assert dep in produced, f"{name} needs {dep}, which no earlier step of `all` writes"
        produced.update(commands[name]["outputs"])


def test_every_dependency_and_output_appears_in_the_script(project):
    for command in project["commands"]:
        tokens = [t for line in command["script"] for t in split_command(line)]
        for path in command["deps"] + command["outputs"]:
            assert any(_under(path, t) for t in tokens if not t.startswith("-")), (command["name"], path)
        assert command["outputs"], f"{command['name']} has no outputs: weasel would rerun it every time"


def test_workflow_outputs_are_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text().split()
    for path in ("/corpus/", "/training/", "/metrics/", "/packages/", "/assets/", "project.lock"):
        assert path in ignored


# --- registered functions reachable without importing the package ------------------------------------------------


def test_config_functions_have_entry_points():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    groups = {"misc": "spacy_misc", "architectures": "spacy_architectures", "batchers": "spacy_batchers",
              "schedules": "thinc_schedules"}  # fmt: skip
    for kind, group in groups.items():
        lines = parser["options.entry_points"][group].strip().splitlines()
        entries = dict(line.split(" = ") for line in lines)
        for name, target in entries.items():
            module, attr = target.split(":")
            assert getattr(registry, kind).get(name) is getattr(importlib.import_module(module), attr)
        # `spacy train` / `spacy assemble` resolve these before any component of ours is created
        used = set()
        for cfg in ("ner_fast.cfg", "ner_trf.cfg", "pipeline.cfg", "linker.cfg"):
            config = load_config(CONFIGS / cfg, interpolate=False)
            used |= {v for path, v in _walk(config) if path.endswith(f"@{kind}") and v.startswith("spacy_conceptnorm.")}
        assert used <= set(entries)
        assert used or kind == "schedules"  # the shipped configs use thinc's own schedules


def _walk(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _walk(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


# --- preprocess -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    for split in ("train", "test"):
        source = FIXTURES / f"ncbi_{split}_sample.txt"
        result = runner.invoke(app, ["preprocess", str(source), str(out / f"{split}.spacy")])
        assert result.exit_code == 0, result.output
    return out


def test_preprocess_round_trips_pubtator_entities_and_concept_ids(corpus):
    records = list(read_pubtator(FIXTURES / "ncbi_test_sample.txt"))
    docs = list(DocBin().from_disk(corpus / "test.spacy").get_docs(spacy.blank("en").vocab))
    assert [d.user_data["pmid"] for d in docs] == [r.pmid for r in records]
    for doc, record in zip(docs, records):
        assert doc.text == record.text
        gold = sorted((a.start, a.end, a.text, a.id) for a in record.annotations)
        assert sorted((e.start_char, e.end_char, e.text, e.kb_id_) for e in doc.ents) == gold
        assert {e.label_ for e in doc.ents} == {"Disease"}
    assert sum(len(d.ents) for d in docs) > 50
    assert not [p for p in corpus.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_preprocess_concatenates_inputs_and_rejects_an_empty_file(corpus, tmp_path):
    both = tmp_path / "train_test.spacy"
    sources = [str(FIXTURES / "ncbi_train_sample.txt"), str(FIXTURES / "ncbi_test_sample.txt")]
    assert runner.invoke(app, ["preprocess", *sources, str(both)]).exit_code == 0
    n = {p: len(DocBin().from_disk(p)) for p in (corpus / "train.spacy", corpus / "test.spacy", both)}
    assert n[both] == n[corpus / "train.spacy"] + n[corpus / "test.spacy"]
    ids = {e.kb_id_ for d in DocBin().from_disk(both).get_docs(spacy.blank("en").vocab) for e in d.ents}
    assert "D001943|D010051" in ids  # a composite mention keeps its ids whole
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    result = runner.invoke(app, ["preprocess", str(empty), str(tmp_path / "empty.spacy")])
    assert result.exit_code != 0 and "no PubTator document" in str(result.exception)
    assert not (tmp_path / "empty.spacy").exists()


def test_preprocess_notes_makes_every_annotated_condition_an_entity(tmp_path):
    """Both record forms of evaluate-assertion's JSONL, one doc a text; the id becomes the kb_id; two spans
    within one token cannot both be entities once widened to it (E626, naming the line)."""
    text = "Denies chest pain, n/v. Exam: wheezes. PMH: hypertension."
    notes = tmp_path / "notes.jsonl"
    whole = {"text": text, "spans": [{"start": 7, "end": 17, "status": "negated", "id": "D002637"},
                                     {"start": 30, "end": 35, "status": "affirmed"}]}  # fmt: skip
    one = {"text": text, "start": 44, "end": 56, "status": "historical"}
    notes.write_text(json.dumps(whole) + "\n\n" + json.dumps(one) + "\n")
    result = runner.invoke(app, ["preprocess-notes", str(notes), str(tmp_path / "notes.spacy")])
    assert result.exit_code == 0 and "1 documents, 3 entities" in result.output, result.output
    (doc,) = DocBin().from_disk(tmp_path / "notes.spacy").get_docs(spacy.blank("en").vocab)
    assert [(e.text, e.label_, e.kb_id_) for e in doc.ents] == [
        ("chest pain", "Disease", "D002637"), ("wheezes", "Disease", ""), ("hypertension", "Disease", ""),
    ]  # fmt: skip
    clash = {"text": "Exam: wheezes.", "spans": [{"start": 6, "end": 9, "status": "affirmed"},
                                                {"start": 10, "end": 13, "status": "affirmed"}]}  # fmt: skip
    (tmp_path / "clash.jsonl").write_text(json.dumps(whole) + "\n" + json.dumps(clash) + "\n")
    result = runner.invoke(app, ["preprocess-notes", str(tmp_path / "clash.jsonl"), str(tmp_path / "c.spacy")])
    assert result.exit_code == 1 and "E626" in result.output and "clash.jsonl:2" in result.output
    assert not (tmp_path / "c.spacy").exists()
    result = runner.invoke(app, ["preprocess-notes", str(FIXTURES / "ncbi_test_sample.txt"), str(tmp_path / "x")])
    assert result.exit_code == 1 and "E622" in result.output and "ncbi_test_sample.txt:1" in result.output


# --- NER configs ------------------------------------------------------------------------------------------------


def _ner_overrides(corpus: Path) -> dict:
    return {"paths.train": str(corpus / "train.spacy"), "paths.dev": str(corpus / "test.spacy")}


@pytest.fixture(scope="module")
def ner_dir(corpus, tmp_path_factory) -> Path:
    """A pipeline from configs/ner_fast.cfg, updated once on the fixture corpus (enough to source it)."""
    config = load_config(CONFIGS / "ner_fast.cfg", overrides=_ner_overrides(corpus), interpolate=False)
    nlp = load_model_from_config(config, auto_fill=True)
    docs = list(DocBin().from_disk(corpus / "train.spacy").get_docs(nlp.vocab))
    examples = [Example(nlp.make_doc(d.text), d) for d in docs]
    optimizer = nlp.initialize(lambda: examples)
    losses = nlp.update(examples[:4], sgd=optimizer)
    assert losses["ner"] > 0
    assert nlp.get_pipe("ner").labels == ("Disease",)
    path = tmp_path_factory.mktemp("ner") / "model-best"
    nlp.to_disk(path)
    return path


def test_ner_config_resolves_and_trains(corpus, ner_dir):
    from spacy.schemas import ConfigSchemaTraining
    from spacy.util import resolve_dot_names

    config = load_config(CONFIGS / "ner_fast.cfg", overrides=_ner_overrides(corpus))
    nlp = load_model_from_config(config, auto_fill=True)
    assert nlp.pipe_names == ["tok2vec", "ner"]
    training = registry.resolve(nlp.config.interpolate()["training"], schema=ConfigSchemaTraining)
    assert 0 < training["max_steps"] <= 5000 and training["eval_frequency"] <= 500  # the CPU budget
    train_corpus, _ = resolve_dot_names(nlp.config.interpolate(), [training["train_corpus"], training["dev_corpus"]])
    assert sum(1 for _ in train_corpus(nlp)) == len(DocBin().from_disk(corpus / "train.spacy"))
    assert (ner_dir / "ner" / "model").is_file()


def test_train_ner_runs_every_recognizer_config():
    """`train-ner` passes the same overrides whichever config `--vars.ner` picks: each config must have them all."""
    for ner in ("trf", "fast"):
        raw = copy.deepcopy(srsly.read_yaml(ROOT / "project.yml"))
        raw = substitute_project_variables(raw, overrides={"vars.ner": ner})
        line = next(c for c in raw["commands"] if c["name"] == "train-ner")["script"][0]
        argv = split_command(line)
        assert argv[4] == f"configs/ner_{ner}.cfg"
        assert "paths.transformer" in _overrides(argv)
        _assert_config_takes_overrides(argv)


def test_train_ner_clinical_runs_every_recognizer_config():
    """`train-ner-clinical` trains whichever recognizer `--vars.ner` picks further, with the config made for it."""
    for ner in ("trf", "fast"):
        raw = copy.deepcopy(srsly.read_yaml(ROOT / "project.yml"))
        raw = substitute_project_variables(raw, overrides={"vars.ner": ner})
        script = next(c for c in raw["commands"] if c["name"] == "train-ner-clinical")["script"]
        argv = split_command(script[1])
        assert argv[4] == f"configs/ner_clinical_{ner}.cfg"
        _assert_config_takes_overrides(argv)
        config = load_config(ROOT / argv[4], interpolate=False)
        listened = "transformer" if ner == "trf" else "tok2vec"
        assert config["nlp"]["pipeline"] == [listened, "ner"]
        assert load_config(CONFIGS / f"ner_{ner}.cfg")["nlp"]["pipeline"] == [listened, "ner"]


@pytest.mark.slow
def test_ner_clinical_fast_trains_the_sourced_recognizer_further(ner_dir, tmp_path):
    """spaCy's own loop on configs/ner_clinical_fast.cfg, two steps on two annotated notes: it starts from the
    sourced recognizer (its label and weights) and saves a model-last that `clinical --ner` can read."""
    from spacy.cli.train import train

    notes = tmp_path / "notes.jsonl"
    text = "Denies chest pain. Exam: wheezes, no rales. Hx of breast cancer."
    spans = [(7, 17, "negated"), (25, 32, "affirmed"), (37, 42, "negated"), (51, 64, "historical")]
    record = {"text": text, "spans": [{"start": s, "end": e, "status": st} for s, e, st in spans]}
    notes.write_text(json.dumps(record) + "\n" + json.dumps({**record, "text": text + " "}) + "\n")
    result = runner.invoke(app, ["preprocess-notes", str(notes), str(tmp_path / "notes.spacy")])
    assert result.exit_code == 0 and "2 documents, 8 entities" in result.output, result.output
    overrides = {"paths.ner": str(ner_dir), "paths.train": str(tmp_path / "notes.spacy"),
                 "paths.dev": str(tmp_path / "notes.spacy"), "training.max_steps": 2}  # fmt: skip
    train(CONFIGS / "ner_clinical_fast.cfg", tmp_path / "out", overrides=overrides)
    before, after = spacy.load(ner_dir), spacy.load(tmp_path / "out" / "model-last")
    assert after.pipe_names == ["tok2vec", "ner"] and after.get_pipe("ner").labels == ("Disease",)
    for name in ("tok2vec", "ner"):  # the same network, every layer of it trained further
        params = [[(node.name, p, node.get_param(p)) for node in pipe.get_pipe(name).model.walk()
                   for p in node.param_names if node.has_param(p)] for pipe in (before, after)]  # fmt: skip
        assert [(n, p, a.shape) for n, p, a in params[0]] == [(n, p, a.shape) for n, p, a in params[1]]
        assert any((a != b).any() for (_, _, a), (_, _, b) in zip(*params))


def test_ner_trf_config_uses_the_packaged_minilm(corpus):
    config = load_config(CONFIGS / "ner_trf.cfg", overrides=_ner_overrides(corpus), interpolate=False)
    nlp = load_model_from_config(config, auto_fill=True)
    assert nlp.pipe_names == ["transformer", "ner"]
    name = nlp.get_pipe("transformer").model.attrs["name"]
    assert name == str(packaged_model_path()) and (Path(name) / "config.json").is_file()
    overrides = {**_ner_overrides(corpus), "paths.transformer": "/models/biobert"}
    config = load_config(CONFIGS / "ner_trf.cfg", overrides=overrides, interpolate=False)
    transformer = load_model_from_config(config, auto_fill=True).get_pipe("transformer")
    assert transformer.model.attrs["name"] == "/models/biobert"  # any other name is passed on unchanged


# --- assemble and package ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_kb(tmp_path_factory) -> Path:
    """A few MEDIC concepts, breast cancer among them: encoding them takes a second."""
    lines = (FIXTURES / "medic_sample.txt").read_text().splitlines()
    path = tmp_path_factory.mktemp("kb") / "medic.txt"
    path.write_text("\n".join(lines[:20] + [line for line in lines if "|D001943||" in line]) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*gold concept ids were not found")
def test_assemble_sources_the_ner_and_packages_with_our_requirement(corpus, ner_dir, small_kb, tmp_path):
    from spacy.cli.package import get_third_party_dependencies
    from spacy.pipeline.tok2vec import Tok2VecListener

    output = tmp_path / "training" / "pipeline"
    args = ["assemble", str(CONFIGS / "pipeline.cfg"), str(output), "--paths.ner", str(ner_dir), "--no-clinical"]
    args += ["--paths.kb", str(small_kb), "--paths.synonyms", str(corpus / "train.spacy")]
    args += ["--paths.train", str(corpus / "train.spacy")]
    result = runner.invoke(app, args)  # --paths.encoder unset: the packaged, untrained encoder
    assert result.exit_code == 0, result.output
    assert [p.name for p in output.parent.iterdir()] == ["pipeline"]  # swapped in, nothing left beside it

    nlp = spacy.load(output)
    assert nlp.pipe_names == [
        "ner", "dictionary_matcher", "abbreviation_resolver", "clinical_abbreviations", "composite_splitter",
        "concept_normalizer", "link_filter",
    ]  # fmt: skip
    # the ner owns a copy of its tok2vec (sourced with replace_listeners): it runs with no tok2vec component
    assert not any(isinstance(layer, Tok2VecListener) for layer in nlp.get_pipe("ner").model.walk())
    nlp("Germline mutations in BRCA1 cause hereditary breast cancer.")
    normalizer = nlp.get_pipe("concept_normalizer")
    assert normalizer.kb.names("domain")  # the training mentions became domain synonyms
    doc = nlp.make_doc("Familial breast cancer.")
    doc.ents = [doc.char_span(9, 22, label="Disease")]
    for _, component in nlp.pipeline[1:-1]:  # not the link_filter: the untrained encoder is not confident
        doc = component(doc)
    assert doc.ents[0].kb_id_ == "D001943"
    # the dictionary_matcher knows the KB's names and the train mentions; a recognizer without vectors adds none
    assert "breast cancer" in {n.lower() for n in nlp.get_pipe("dictionary_matcher").names}
    assert nlp.vocab.vectors.shape[0] == 0
    # `spacy package` puts our package in the wheel's requirements: the components' factories live there
    assert any(r.startswith("spacy-conceptnorm") for r in get_third_party_dependencies(nlp.config))
