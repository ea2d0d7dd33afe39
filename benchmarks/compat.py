"""Compatibility with release 0.2.0: a pipeline saved by 0.2.0 loads and links the same with the current code.

    python -m benchmarks.compat OLD_PIPELINE [--test ../shared/data/ncbi-disease/NCBItestset_corpus.txt] [--end-to-end]

OLD_PIPELINE is a pipeline directory saved by 0.2.0. The gold mentions of the test file are linked twice: by
0.2.0's code, in a fresh process that imports the release's source tree (taken from git history, first on its
import path), and by the current code, in this process, which loads the pipeline with `spacy_conceptnorm.load`.
Both get the same docs (the gold entities without their ids, from a DocBin) and turn off the same components (those
that set `doc.ents`, and clinical_context), as gold-mention linking does. It prints how many mentions got identical
`ent._.kb_ents` (the same ids in the same order, scores within 1e-6) and the same `kb_id_`, and exits 1 if any
differs. --end-to-end also runs every component on the raw texts (the pipeline's own recognizers find the entities)
and compares those entities the same way.

A 0.2.0 pipeline without a trained recognizer, built by 0.2.0's own `assemble` (a few minutes on 2 cores):

    python -m benchmarks.compat release-config /tmp/v020.cfg
    python -m benchmarks.compat release-cli assemble /tmp/v020.cfg /tmp/v020-pipeline \\
        --paths.kb ../shared/data/medic/medic_06Jul2012.txt \\
        --paths.synonyms ../shared/data/ncbi-disease/NCBItrainset_corpus.txt \\
        --paths.train ../shared/data/ncbi-disease/NCBItrainset_corpus.txt

`release-config` writes 0.2.0's configs/pipeline.cfg without its `ner` (`release_config`); `release-cli` runs
0.2.0's command line (`python -m spacy_conceptnorm ...` of the release) with the arguments given.

The release process: its PYTHONPATH puts the extracted tree first, and the tree holds a `spacy_conceptnorm`
dist-info with the release's entry points (from its setup.cfg), which shadows the installed package's: spaCy finds
factories and registered functions through entry points first, and the installed ones name the current modules.
An editable install's import hook (which would find a module the release lacks in the current tree) is taken off
`sys.meta_path`. The process checks that `spacy_conceptnorm` and every component's class come from the tree.

This file runs in both processes: it imports nothing of the package at module level.
"""

from __future__ import annotations

import argparse
import configparser
import importlib
import importlib.metadata
import io
import json
import os
import runpy
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# Release 0.2.0: the parent of 468dfb3 ("CHANGELOG: Unreleased"); its spacy_conceptnorm/about.py says 0.2.0.
RELEASE = "2121407d0623e269c86b09ce9ce0de3e2d2d042d"
RELEASE_VERSION = "0.2.0"
REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-6
PACKAGE = "spacy_conceptnorm"
MODES = ("gold", "end_to_end")


class ReleaseUnavailable(RuntimeError):
    """The release's source cannot be taken from git history."""


# --- the release's source tree ----------------------------------------------------------------------------------
def _git(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True)
    except FileNotFoundError:
        raise ReleaseUnavailable("git is not installed: the 0.2.0 source is taken from git history") from None


def extract_release(dest: Path, rev: str = RELEASE, version: str = RELEASE_VERSION) -> Path:
    """The release's `spacy_conceptnorm` and `configs` from git history, in `dest`, with a dist-info that gives the
    release's entry points. Raises ReleaseUnavailable, saying why, when the history is not there.

    dest (Path): An empty or new directory.
    rev (str): The release commit.
    version (str): The version its about.py must say.
    RETURNS (Path): `dest`, to put first on PYTHONPATH.
    """
    if _git("rev-parse", "--git-dir").returncode != 0:
        raise ReleaseUnavailable(
            f"{REPO} is not a git checkout: the {version} source tree is taken from git history "
            "(run from a git clone of the repository)"
        )
    if _git("cat-file", "-e", f"{rev}^{{commit}}").returncode != 0:
        raise ReleaseUnavailable(
            f"commit {rev} (release {version}) is not in the history of {REPO}: a shallow clone? "
            "(git fetch --unshallow)"
        )
    archive = _git("archive", "--format=tar", rev, PACKAGE, "configs", "setup.cfg")
    if archive.returncode != 0:
        raise ReleaseUnavailable(f"git archive {rev} failed: {archive.stderr.decode(errors='replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.10.12
            tar.extractall(dest)  # noqa: S202 (our own repository's archive)
    about = (dest / PACKAGE / "about.py").read_text(encoding="utf-8")
    if f'__version__ = "{version}"' not in about:
        raise ReleaseUnavailable(f"commit {rev} is not release {version}: its about.py says\n{about}")
    entry_points = configparser.ConfigParser(interpolation=None)
    entry_points.optionxform = str  # keep the names' case
    entry_points.read_dict(declared_entry_points(dest / "setup.cfg"))
    dist_info = dest / f"{PACKAGE}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: spacy-conceptnorm\nVersion: {version}\n", encoding="utf-8"
    )
    with (dist_info / "entry_points.txt").open("w", encoding="utf-8") as f:
        entry_points.write(f)
    return dest


def declared_entry_points(setup_cfg: Path) -> dict[str, dict[str, str]]:
    """The [options.entry_points] of a setup.cfg: {group: {name: "module:attribute"}}."""
    setup = configparser.ConfigParser(interpolation=None)
    setup.read(setup_cfg, encoding="utf-8")
    out = {}
    for group, lines in setup["options.entry_points"].items():
        pairs = (line.split("=", 1) for line in lines.strip().splitlines())
        out[group] = {name.strip(): target.strip() for name, target in pairs}
    return out


def release_config(tree: Path, encoder: dict | None = None, index_type: str | None = None):
    """The release's configs/pipeline.cfg without its `ner` (sourced from a trained recognizer): dictionary_matcher
    -> abbreviation_resolver -> composite_splitter -> concept_normalizer -> link_filter, for its `assemble` with
    --paths.kb, --paths.synonyms and --paths.train (a PubTator file or DocBin each).

    encoder (Optional[dict]): Replaces the concept_normalizer's encoder block (None: the configured one, the
        packaged all-MiniLM-L6-v2 unless --paths.encoder is given).
    index_type (Optional[str]): Replaces the index type (None: the configured HNSW).
    RETURNS (Config): The config (spaCy's; write it with `to_disk`).
    """
    from spacy.util import load_config

    config = load_config(tree / "configs" / "pipeline.cfg", interpolate=False)
    config["nlp"]["pipeline"] = [name for name in config["nlp"]["pipeline"] if name != "ner"]
    del config["components"]["ner"]
    del config["paths"]["ner"]
    config["initialize"]["vectors"] = None
    normalizer = config["components"]["concept_normalizer"]
    if encoder is not None:
        normalizer["encoder"] = encoder
    if index_type is not None:
        normalizer["index"] = {"index_type": index_type}
    return config


def release_env(tree: Path, extra_paths: list[Path] = ()) -> dict[str, str]:
    """The environment of a release process: the tree first on PYTHONPATH, then `extra_paths` (nothing else)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [tree, *extra_paths])
    env.pop("PYTHONSTARTUP", None)
    return env


def run_release(tree: Path, args: list[str], preload: list[Path] = (), cwd: Path | None = None, **kwargs):
    """Run this file's worker in a release process (`_in_release`), in `cwd` (default: the tree's parent).

    args (List[str]): ["cli", ...] (the release's command line) or ["link", PIPELINE, DOCS, OUT, ...].
    preload (List[Path]): Python files run first (e.g. registering a test encoder); their folders join PYTHONPATH
        after the tree.
    RETURNS (CompletedProcess): The process, run with `check=False` and `kwargs`.
    """
    # `python -c` with its first sys.path entry (the working directory, which may hold the current package) taken
    # off, so that the tree comes first
    code = f"import runpy, sys; sys.path.pop(0); runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    command = [sys.executable, "-c", code, "_in_release", str(tree)]
    for path in preload:
        command += ["--preload", str(path)]
    folders = list(dict.fromkeys(Path(p).resolve().parent for p in preload))
    return subprocess.run(
        [*command, *args], env=release_env(tree, folders), cwd=cwd or tree.parent, check=False, **kwargs
    )


# --- in a release process ---------------------------------------------------------------------------------------
def _is_editable_hook(finder) -> bool:
    module = getattr(finder, "__module__", "") or type(finder).__module__
    return "editable" in module and PACKAGE in module


def use_release(tree: Path) -> dict:
    """Make this process run the release in `tree` (first on its PYTHONPATH): take an editable install's import hook
    off, import `spacy_conceptnorm` and the modules of its factories (through the release's entry points), and
    check that each comes from the tree. RETURNS (dict): {"package": its file, "version", "factories": {name:
    module file}}; raises RuntimeError when anything comes from elsewhere."""
    tree = tree.resolve()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not _is_editable_hook(finder)]
    package = importlib.import_module(PACKAGE)
    about = importlib.import_module(f"{PACKAGE}.about")
    _check_in_tree(package, tree)
    factories = {}
    for entry in importlib.metadata.entry_points(group="spacy_factories"):
        if entry.value.split(".")[0].split(":")[0] != PACKAGE:
            continue
        try:
            module = importlib.import_module(entry.module)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] == PACKAGE:
                raise RuntimeError(f"factory {entry.name}: {entry.value} is not in the release tree ({e})") from e
            continue  # an optional dependency (medspaCy for clinical_context) that is not installed
        _check_in_tree(module, tree)
        factories[entry.name] = module.__file__
    if "concept_normalizer" not in factories:
        raise RuntimeError("the release's entry points give no concept_normalizer: is its dist-info in the tree?")
    return {"package": package.__file__, "version": about.__version__, "factories": factories}


def _check_in_tree(module, tree: Path) -> None:
    file = Path(module.__file__).resolve()
    if not file.is_relative_to(tree):
        raise RuntimeError(f"{module.__name__} was imported from {file}, not from the release tree {tree}")


def _in_release(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="compat.py _in_release")
    parser.add_argument("tree", type=Path)
    parser.add_argument("--preload", type=Path, action="append", default=[])
    sub = parser.add_subparsers(dest="action", required=True)
    cli = sub.add_parser("cli")
    cli.add_argument("args", nargs=argparse.REMAINDER)
    link_parser = sub.add_parser("link")
    link_parser.add_argument("pipeline", type=Path)
    link_parser.add_argument("docs", type=Path)
    link_parser.add_argument("output", type=Path)
    link_parser.add_argument("--modes", nargs="+", choices=MODES, default=["gold"])
    args = parser.parse_args(argv)
    release = use_release(args.tree)
    for path in args.preload:
        runpy.run_path(str(path))
    if args.action == "cli":
        sys.argv = [f"{PACKAGE} (release {release['version']})", *args.args]
        try:
            runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return 0
    result = link_saved(args.pipeline, args.docs, args.modes, tree=args.tree.resolve())
    args.output.write_text(json.dumps({**release, **result}), encoding="utf-8")
    return 0


# --- in both ----------------------------------------------------------------------------------------------------
def gold_linking_off(nlp) -> list[str]:
    """The components linking gold mentions turns off: those that set `doc.ents`, and clinical_context. The rule of
    `evaluation.gold.gold_linking_off`, written out here because it runs in the 0.2.0 process too, whose package
    has no `evaluation.gold`."""
    return [
        name
        for name in nlp.pipe_names
        if "doc.ents" in nlp.get_pipe_meta(name).assigns or nlp.get_pipe_meta(name).factory == "clinical_context"
    ]


def entity_links(doc) -> list[dict]:
    """Each entity of a linked doc: offsets, label, kb_id_, kb_ents (scores as Python floats)."""
    return [
        {
            "start": ent.start_char,
            "end": ent.end_char,
            "label": ent.label_,
            "kb_id": ent.kb_id_,
            "kb_ents": None if ent._.kb_ents is None else [[str(c), float(s)] for c, s in ent._.kb_ents],
        }
        for ent in doc.ents
    ]


def link_docs(nlp, docs, gold: bool = True) -> list[list[dict]]:
    """`entity_links` of each doc run through `nlp`; `gold`: with the components that set entities turned off."""
    with nlp.select_pipes(disable=gold_linking_off(nlp) if gold else []):
        return [entity_links(doc) for doc in nlp.pipe(docs)]


def link_saved(pipeline, docs_path: Path, modes=("gold",), tree: Path | None = None) -> dict:
    """Link the docs of the DocBin `docs_path` with a saved pipeline.

    pipeline (Union[Path, Language]): Its directory, loaded with this process's `spacy_conceptnorm.load`, or the
        pipeline loaded so.
    modes (Iterable[str]): "gold" (their entities, the components that set entities turned off) and/or
        "end_to_end" (every component on, entities from the pipeline's own recognizers).
    tree (Optional[Path]): Every component of the package must come from this release tree (RuntimeError).
    RETURNS (dict): {"pipes": {name: module and file of its class}, mode: `link_docs` for each mode}."""
    from spacy.tokens import DocBin

    import spacy_conceptnorm

    nlp = spacy_conceptnorm.load(pipeline) if isinstance(pipeline, (str, Path)) else pipeline
    pipes = {}
    for name, pipe in nlp.pipeline:
        module = sys.modules[type(pipe).__module__]
        pipes[name] = f"{module.__name__} ({module.__file__})"
        if tree is not None and module.__name__.split(".")[0] == PACKAGE:
            _check_in_tree(module, tree)
    docs = list(DocBin().from_disk(docs_path).get_docs(nlp.vocab))
    return {"pipes": pipes, **{mode: link_docs(nlp, docs, gold=mode == "gold") for mode in modes}}


def write_docs(docs, path: Path) -> Path:
    """The docs' words, spaces and entities (offsets and labels, no concept ids) as a DocBin: the input of both."""
    from spacy.tokens import DocBin

    DocBin(attrs=["ORTH", "SPACY", "ENT_IOB", "ENT_TYPE"], docs=docs, store_user_data=False).to_disk(path)
    return path


def compare(old: list[list[dict]], new: list[list[dict]], tolerance: float = TOLERANCE) -> dict:
    """Mention by mention: "mentions", "same_kb_ents" (ids in order, scores within `tolerance`), "same_kb_id",
    "max_score_diff" and "differences" ((doc index, old entity, new entity) of those that differ, or whose
    entities are not the same spans)."""
    out = {"mentions": 0, "same_kb_ents": 0, "same_kb_id": 0, "max_score_diff": 0.0, "differences": []}
    for i, (old_ents, new_ents) in enumerate(zip(old, new, strict=True)):
        new_at = {(e["start"], e["end"]): e for e in new_ents}
        for o in old_ents:
            out["mentions"] += 1
            n = new_at.pop((o["start"], o["end"]), None)
            if n is None:
                out["differences"].append((i, o, None))
                continue
            same_ents = _same_kb_ents(o["kb_ents"], n["kb_ents"], tolerance)
            same_id = o["kb_id"] == n["kb_id"] and o["label"] == n["label"]
            out["same_kb_ents"] += same_ents
            out["same_kb_id"] += same_id
            if o["kb_ents"] and n["kb_ents"] and [c for c, _ in o["kb_ents"]] == [c for c, _ in n["kb_ents"]]:
                diffs = [abs(a[1] - b[1]) for a, b in zip(o["kb_ents"], n["kb_ents"])]
                out["max_score_diff"] = max(out["max_score_diff"], *diffs)
            if not (same_ents and same_id):
                out["differences"].append((i, o, n))
        out["differences"].extend((i, None, n) for n in new_at.values())
    return out


def _same_kb_ents(a: list | None, b: list | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x[0] == y[0] and abs(x[1] - y[1]) <= tolerance for x, y in zip(a, b))


# --- the benchmark ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["release-cli"]:
        with tempfile.TemporaryDirectory(prefix="compat-") as tmp:
            tree = extract_release(Path(tmp) / "release")
            return run_release(tree, ["cli", *argv[1:]], cwd=Path.cwd()).returncode
    if argv[:1] == ["release-config"] and len(argv) == 2:
        with tempfile.TemporaryDirectory(prefix="compat-") as tmp:
            release_config(extract_release(Path(tmp) / "release")).to_disk(argv[1])
        print(f"0.2.0's configs/pipeline.cfg without its ner -> {argv[1]}")
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", type=Path, help="A pipeline directory saved by 0.2.0")
    parser.add_argument(
        "--test",
        type=Path,
        default=Path("../shared/data/ncbi-disease/NCBItestset_corpus.txt"),
        help="PubTator file whose gold mentions are linked",
    )
    parser.add_argument("--rev", default=RELEASE, help="The release commit (default: 0.2.0's)")
    parser.add_argument("--version", default=RELEASE_VERSION, help="The version its about.py says")
    parser.add_argument("--show", type=int, default=10, help="Differences printed")
    parser.add_argument(
        "--end-to-end", action="store_true", help="Also compare the entities of every component run on the raw texts"
    )
    args = parser.parse_args(argv)
    modes = MODES if args.end_to_end else ("gold",)

    import spacy_conceptnorm
    from spacy_conceptnorm.io.corpus import pubtator_to_docs

    with tempfile.TemporaryDirectory(prefix="compat-") as tmp:
        tmp = Path(tmp)
        tree = extract_release(tmp / "release", args.rev, args.version)
        nlp = spacy_conceptnorm.load(args.pipeline)
        docs = write_docs(pubtator_to_docs(nlp, args.test), tmp / "docs.spacy")
        link = ["link", str(args.pipeline.resolve()), str(docs), str(tmp / "old.json"), "--modes", *modes]
        done = run_release(tree, link)
        if done.returncode != 0:
            print(f"the {args.version} process failed (exit {done.returncode})", file=sys.stderr)
            return 2
        old = json.loads((tmp / "old.json").read_text(encoding="utf-8"))
        new = link_saved(nlp, docs, modes)
    print(f"{args.version} code: {old['package']} ({', '.join(f'{k}: {v}' for k, v in old['pipes'].items())})")
    print(f"current code: {spacy_conceptnorm.__file__} ({', '.join(f'{k}: {v}' for k, v in new['pipes'].items())})")
    differ = False
    for mode in modes:
        result = compare(old[mode], new[mode])
        differ = differ or bool(result["differences"])
        for i, o, n in result["differences"][: args.show]:
            print(f"  {mode}, doc {i}: {args.version} {o}\n    current {n}")
        what = "gold mentions" if mode == "gold" else "entities found end to end (their 0.2.0 spans)"
        print(
            f"{args.pipeline}: {result['same_kb_ents']}/{result['mentions']} {what} of {args.test.name} with "
            f"identical kb_ents ({args.version} code vs current, scores within {TOLERANCE:g}; largest difference "
            f"{result['max_score_diff']:.2g}), {result['same_kb_id']}/{result['mentions']} with the same kb_id_"
            + (f", {len(result['differences'])} differing" if result["differences"] else "")
        )
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_in_release"]:
        sys.exit(_in_release(sys.argv[2:]))
    sys.exit(main())
