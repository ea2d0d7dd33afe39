"""`benchmark weight`: the weight of a saved pipeline: what each component adds to `spacy.load`, its bytes on disk,
and the whole above the floor that is not ours.

    python -m spacy_conceptnorm benchmark weight PIPELINE [--runs 3] [--output figures.json]

Every figure comes from a fresh Python process, `--runs` times (the table gives medians). Each process times
from `import spacy` to the end of one short document (`--text`), and reads its peak resident memory (`getrusage`):

- `spacy.blank("en")`: the floor. spaCy imports every installed package's spaCy entry points whichever components
  a pipeline has (spacy-transformers' import alone takes seconds), so the floor is measured with them;
- the recognizer alone: the pipeline loaded with only spaCy's own components (`ner`, and the `transformer` or
  `tok2vec` it reads), the floor of a pipeline that recognizes;
- the linker alone: every other component but the `dictionary_matcher`, the document's mentions (`--mention`)
  marked;
- the whole pipeline. In its process each component's build (its factory) and load (`from_disk`) are timed and
  the resident memory (VmRSS) they add is read, and after the document a second one (`--unseen-text`) with a
  mention that is no name of the knowledge base: what opening the linker's encoder on first use costs.

The default documents are about diseases, their mentions MEDIC names (linked with no encoder); give a pipeline on
another knowledge base documents whose mentions are its names, or the first document opens the encoder too (its
links are printed).

The last line is `above floor: +X s, +Y MB`, the whole pipeline's time and peak memory over `spacy.blank("en")`'s
(the median over the rounds of each round's difference: the setups take turns, one fresh process each a round).
docs/benchmarks.md has the figures of the shipped pipeline.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import typer

from ._util import benchmark_cli

SPACY_RECOGNIZERS = ("ner", "transformer", "tok2vec", "entity_ruler", "span_ruler", "spancat")  # factories
NOT_LINKER = ("dictionary_matcher",)  # ours, but a recognizer's helper
TEXT = "Patients with breast cancer and cystic fibrosis were seen."
MENTIONS = ("breast cancer", "cystic fibrosis")  # MEDIC names: linked with no encoder
UNSEEN = "Patients with tumours of the mammary gland in young women were seen."
UNSEEN_MENTIONS = ("tumours of the mammary gland in young women",)

CHILD = r"""
import json, resource, sys, time

start = time.perf_counter()
args = json.loads(sys.argv[1])

def rss():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmRSS"].split()[0]) / 1024

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def run(nlp, text, mentions):
    doc = nlp.make_doc(text)
    if mentions is not None:
        spans = []
        for mention in mentions:
            begin = text.index(mention)
            spans.append(doc.char_span(begin, begin + len(mention), label="Disease"))
        doc.ents = spans
    for _, proc in nlp.pipeline:
        doc = proc(doc)
    return [(ent.text, ent.kb_id_) for ent in doc.ents]

import spacy
import spacy.util
from spacy.language import Language

figures = {"components": {}}
if args["mode"] == "blank":
    nlp = spacy.blank("en")
else:
    parts = figures["components"]
    add_pipe, from_disk = Language.add_pipe, spacy.util.from_disk

    def timed_add_pipe(self, factory_name, name=None, **kwargs):
        before, clock = rss(), time.perf_counter()
        proc = add_pipe(self, factory_name, name, **kwargs)
        parts[name or factory_name] = {"build": time.perf_counter() - clock, "rss": rss() - before}
        return proc

    depth = [0]

    def timed_from_disk(path, readers, exclude):  # the pipeline's own readers; a component's are left alone
        def reader(key, read):
            def timed(p):
                before, clock = rss(), time.perf_counter()
                read(p)
                part = parts.setdefault(key, {"build": 0.0, "rss": 0.0})
                part["load"] = time.perf_counter() - clock
                part["rss"] += rss() - before
            return timed
        if depth[0]:
            return from_disk(path, readers, exclude)
        depth[0] += 1
        try:
            return from_disk(path, {key: reader(key, read) for key, read in readers.items()}, exclude)
        finally:
            depth[0] -= 1

    Language.add_pipe, spacy.util.from_disk = timed_add_pipe, timed_from_disk
    imports = time.perf_counter() - start
    nlp = spacy.load(args["pipeline"], exclude=args["exclude"])
    figures["load"] = time.perf_counter() - start - imports
    Language.add_pipe, spacy.util.from_disk = add_pipe, from_disk
    figures["imports"] = imports
figures["links"] = run(nlp, args["text"], args["mentions"])
figures["seconds"], figures["peak"] = time.perf_counter() - start, peak()
if args["unseen"]:
    before, clock = rss(), time.perf_counter()
    figures["unseen_links"] = run(nlp, args["unseen"], args["unseen_mentions"])
    figures["unseen_seconds"], figures["unseen_rss"] = time.perf_counter() - clock, rss() - before
print(json.dumps(figures))
"""


def machine() -> str:
    """The CPU's model name, cores and whether it has native bf16 (from /proc/cpuinfo where there is one): the
    first words of a benchmark's report, since its figures hold for that machine only."""
    name, flags = platform.processor() or platform.machine(), set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    bf16 = "AVX512-BF16" if "avx512_bf16" in flags else ("AVX-512" if "avx512f" in flags else "no AVX-512")
    return f"{name}, {os.cpu_count()} CPUs, {bf16}"


def fresh_process(code: str, args: dict) -> dict:
    """The JSON that `code` prints last, run in a fresh Python process with `args` (JSON) as its argument: a
    process's first load is what a user waits for, and the peak memory of one process is its own."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)], env=env, capture_output=True, text=True, timeout=900
    )
    if run.returncode != 0:
        typer.echo(f"Error: the measuring process failed ({run.returncode}):\n{run.stderr[-3000:]}", err=True)
        raise typer.Exit(1)
    return json.loads(run.stdout.strip().splitlines()[-1])


def disk_mb(path: Path) -> float:
    """The bytes of a file, or of every file under a directory, in MB."""
    files = path.rglob("*") if path.is_dir() else [path]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def components(pipeline: Path) -> tuple[list[str], dict[str, str]]:
    """The pipeline's component names, in order, and each one's factory (from its config.cfg, without loading it)."""
    from spacy.util import load_config

    config = load_config(pipeline / "config.cfg", interpolate=False)
    return list(config["nlp"]["pipeline"]), {name: c.get("factory", name) for name, c in config["components"].items()}


def check_mentions(text: str, mentions: list[str], option: str) -> None:
    """Every mention must be found in its text, where the measuring process marks it."""
    for mention in mentions:
        if mention not in text:
            raise typer.BadParameter(f"{mention!r} is not in the text {text!r}", param_hint=option)


@benchmark_cli.command("weight")
def benchmark_weight(
    pipeline: Path = typer.Argument(..., help="Saved pipeline directory", exists=True, file_okay=False),
    runs: int = typer.Option(3, min=1, help="Fresh processes per measurement"),
    output: Path = typer.Option(None, help="Write every run's figures and the medians as JSON here"),
    text: str = typer.Option(TEXT, help="The short document each process ends with"),
    mention: list[str] = typer.Option(
        list(MENTIONS),
        help="A mention in --text, marked where no recognizer runs (the linker alone): a KB name; repeatable",
    ),
    unseen_text: str = typer.Option(UNSEEN, help="The document after it, whose mention is no KB name"),
    unseen_mention: list[str] = typer.Option(list(UNSEEN_MENTIONS), help="Its mention (repeatable)"),
) -> None:
    """Load time and memory of a saved pipeline, per component, above a blank spaCy.

    Fresh processes time `import spacy` to the end of one short document and read their peak memory. The last line
    is `above floor: +X s, +Y MB` (docs/benchmarks.md).
    """
    check_mentions(text, mention, "--mention")
    check_mentions(unseen_text, unseen_mention, "--unseen-mention")
    names, factories = components(pipeline)
    recognizer = [name for name in names if factories.get(name) in SPACY_RECOGNIZERS]
    linker = [name for name in names if name not in recognizer and factories.get(name) not in NOT_LINKER]
    base = {"pipeline": str(pipeline), "text": text, "mentions": None, "unseen": None, "unseen_mentions": None}
    setups = {
        'spacy.blank("en")': {**base, "mode": "blank"},
        "recognizer alone": {**base, "mode": "load", "exclude": [n for n in names if n not in recognizer]},
        "linker alone": {
            **base,
            "mode": "load",
            "exclude": [n for n in names if n not in linker],
            "mentions": list(mention),
            "unseen": unseen_text,
            "unseen_mentions": list(unseen_mention),
        },
        "whole pipeline": {
            **base,
            "mode": "load",
            "exclude": [],
            "unseen": unseen_text,
            "unseen_mentions": None if recognizer else list(unseen_mention),
            "mentions": None if recognizer else list(mention),
        },
    }
    if not recognizer:
        del setups["recognizer alone"]
    if not linker or linker == names:
        del setups["linker alone"]
    results: dict[str, list[dict]] = {label: [] for label in setups}
    for _ in range(runs):  # the setups take turns, so that a change in the machine's load falls on all
        for label, args in setups.items():
            results[label].append(fresh_process(CHILD, args))

    def median(label: str, key: str) -> float:
        return statistics.median(run[key] for run in results[label])

    whole = results["whole pipeline"]
    typer.echo(f"{pipeline}: {runs} fresh processes per row; {machine()}; load average {os.getloadavg()[0]:.2f}")
    typer.echo("\n| process (import spacy -> spacy.load -> one short doc) | seconds | range | peak RSS MB |")
    typer.echo("|---|---|---|---|")
    for label in setups:
        seconds = [run["seconds"] for run in results[label]]
        spread = f"{min(seconds):.2f}-{max(seconds):.2f}"
        typer.echo(f"| {label} | {median(label, 'seconds'):.2f} | {spread} | {median(label, 'peak'):.0f} |")
    typer.echo("\n| component (whole pipeline's spacy.load) | build s | from_disk s | RSS added MB | on disk MB |")
    typer.echo("|---|---|---|---|---|")
    for part in whole[0]["components"]:
        build, load, rss = (
            statistics.median(run["components"][part].get(key, 0.0) for run in whole)
            for key in ("build", "load", "rss")
        )
        size = f"{disk_mb(pipeline / part):.2f}" if (pipeline / part).exists() else ""
        typer.echo(f"| {part} | {build:.3f} | {load:.3f} | {rss:.0f} | {size} |")
    rest = statistics.median(
        run["load"] - sum(p.get("build", 0) + p.get("load", 0) for p in run["components"].values()) for run in whole
    )
    typer.echo(f"| (the rest of spacy.load: entry points, config) | {rest:.2f} | | | |")
    typer.echo(f"| (import spacy, before spacy.load) | {median('whole pipeline', 'imports'):.2f} | | | |")
    typer.echo(f"saved pipeline on disk: {disk_mb(pipeline):.1f} MB")
    typer.echo(f"links of the short doc: {whole[-1]['links']}")
    for label in ("linker alone", "whole pipeline"):
        if label in setups and setups[label]["unseen"]:
            typer.echo(
                f"{label}, first unseen mention (the encoder opens): +{median(label, 'unseen_seconds'):.2f} s, "
                f"+{median(label, 'unseen_rss'):.0f} MB RSS, {results[label][-1]['unseen_links']}"
            )

    def above_floor(label: str, key: str) -> float:
        """The median over the rounds of the setup's figure less the floor's of the same round: a fresh process's
        seconds vary by a second from one to the next, more than the rounds' medians differ."""
        pairs = zip(results[label], results['spacy.blank("en")'])
        return statistics.median(run[key] - floor[key] for run, floor in pairs)

    if "linker alone" in setups:
        typer.echo(
            f"linker alone above floor: {above_floor('linker alone', 'seconds'):+.2f} s, "
            f"{above_floor('linker alone', 'peak'):+.0f} MB"
        )
    if output:
        from ..io.files import write_json

        write_json(output, {"machine": machine(), "setups": setups, "runs": results})
    typer.echo(
        f"above floor: {above_floor('whole pipeline', 'seconds'):+.2f} s, "
        f"{above_floor('whole pipeline', 'peak'):+.0f} MB"
    )
