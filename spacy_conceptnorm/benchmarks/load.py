"""Start-up cost of a saved pipeline: import time, `spacy.load` time and resident memory, each in a fresh process.

    python -m spacy_conceptnorm.benchmarks.load PIPELINE [--repeats 3] [--output figures.json]

Each repeat starts a new Python process that
1. imports spaCy and spacy_conceptnorm ("imports": spaCy imports torch when it is installed, as thinc does);
2. calls `spacy.load(PIPELINE)` ("load", after the imports);
3. links a document whose mentions are all exact knowledge-base names ("known"), then one with a mention that is
   no name of the knowledge base ("unseen", which needs the encoder).
After each step it reads the process's resident memory (VmRSS) and its peak so far (VmHWM) from /proc, and whether
the encoder's weights are loaded. A pipeline with no entity recognizer ("ner", "entity_ruler", "span_ruler") gets
its entities marked on the texts (`--known`, `--unseen`); one with a recognizer finds its own. The table gives the
median of each figure over the repeats, and the packages that `spacy.load` imported.

spaCy imports every installed package's spaCy entry points in `spacy.load` (Language.__init__ loads the factory
registry), whichever components the pipeline has: with spacy-transformers installed (a dependency of this package,
for the transformer NER recipe) that is transformers and parts of torch, scikit-learn and pandas. `--hide-entry-points
spacy_transformers` drops that package's entry points in the measuring process, to measure the pipeline as if it
were not installed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import typer

from ..util import atomic_open
from .weight import fresh_process

app = typer.Typer(add_completion=False)

KNOWN = ("breast cancer", "cystic fibrosis")  # MEDIC names (synonyms of D001943 and D003550)
UNSEEN = ("tumours of the mammary gland in young women",)
RECOGNIZERS = ("ner", "entity_ruler", "span_ruler")

CHILD = r"""
import json, sys, time

def memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}

def encoder_loaded(nlp):
    if "concept_normalizer" not in nlp.pipe_names:
        return None
    encoder = nlp.get_pipe("concept_normalizer").encoder
    return bool(getattr(encoder, "loaded", getattr(encoder, "_model", None) is not None))

args = json.loads(sys.argv[1])
figures = {}
start = time.perf_counter()
if args["hide"]:
    import catalogue
    eps = catalogue.AVAILABLE_ENTRY_POINTS
    eps = [ep for group in eps.values() for ep in group] if isinstance(eps, dict) else list(eps)
    groups = {}  # a plain dict: catalogue then reads it with .get(group)
    for ep in eps:
        if ep.value.split(":")[0].split(".")[0] not in args["hide"]:
            groups.setdefault(ep.group, []).append(ep)
    catalogue.AVAILABLE_ENTRY_POINTS = groups
import spacy
import spacy_conceptnorm
figures["imports"] = {"seconds": time.perf_counter() - start, **memory(), "torch": "torch" in sys.modules}
before = {name.split(".")[0] for name in sys.modules}
start = time.perf_counter()
nlp = spacy.load(args["pipeline"])
figures["load"] = {"seconds": time.perf_counter() - start, **memory(), "encoder": encoder_loaded(nlp)}
figures["load"]["imported"] = sorted({name.split(".")[0] for name in sys.modules} - before - {"__main__"})
mark = not any(name in args["recognizers"] for name in nlp.pipe_names)
for step, mentions in (("known", args["known"]), ("unseen", args["unseen"])):
    text = "Patients with " + ", ".join(mentions) + " were seen."
    start = time.perf_counter()
    doc = nlp.make_doc(text)
    if mark:
        spans = []
        for mention in mentions:
            begin = text.index(mention)
            spans.append(doc.char_span(begin, begin + len(mention), label="Disease", alignment_mode="expand"))
        doc.ents = spans
    for _, proc in nlp.pipeline:
        doc = proc(doc)
    seconds = time.perf_counter() - start
    links = [(ent.text, ent.kb_id_) for ent in doc.ents]
    figures[step] = {"seconds": seconds, **memory(), "encoder": encoder_loaded(nlp), "links": links}
print(json.dumps(figures))
"""


def measure(pipeline: Path, known: list[str], unseen: list[str], hide: list[str]) -> dict:
    """One fresh process's figures (see the module docstring)."""
    args = {"pipeline": str(pipeline), "known": known, "unseen": unseen, "recognizers": list(RECOGNIZERS), "hide": hide}
    return fresh_process(CHILD, args)


@app.command()
def main(
    pipeline: Path = typer.Argument(..., help="Saved pipeline directory", exists=True, file_okay=False),
    repeats: int = typer.Option(3, min=1, help="Fresh processes measured"),
    known: list[str] = typer.Option(list(KNOWN), help="Mentions that are exact KB names (marked if no recognizer)"),
    unseen: list[str] = typer.Option(list(UNSEEN), help="Mentions that are no KB name (marked if no recognizer)"),
    hide_entry_points: list[str] = typer.Option([], help="Packages whose spaCy entry points are dropped"),
    output: Path = typer.Option(None, help="Write every repeat's figures and the medians as JSON here"),
) -> None:
    runs = [measure(pipeline, known, unseen, hide_entry_points) for _ in range(repeats)]
    steps = list(runs[0])
    median = {
        step: {key: statistics.median(run[step][key] for run in runs) for key in ("seconds", "VmRSS", "VmHWM")}
        for step in steps
    }
    load = os.getloadavg()
    hidden = f", entry points of {', '.join(hide_entry_points)} hidden" if hide_entry_points else ""
    typer.echo(f"{pipeline}: {repeats} fresh processes, {os.cpu_count()} CPUs, load average {load[0]:.2f} at the end"
               f"{hidden}")  # fmt: skip
    typer.echo("| step | seconds (median) | RSS MiB | peak RSS MiB | encoder loaded |")
    typer.echo("|---|---|---|---|---|")
    for step in steps:
        m, last = median[step], runs[-1][step]
        loaded = last.get("encoder", "torch " + ("yes" if last.get("torch") else "no"))
        typer.echo(f"| {step} | {m['seconds']:.2f} | {m['VmRSS']:.0f} | {m['VmHWM']:.0f} | {loaded} |")
    for step in ("known", "unseen"):
        typer.echo(f"{step} links: {runs[-1][step]['links']}")
    typer.echo(f"packages imported by spacy.load: {', '.join(runs[-1]['load']['imported']) or 'none'}")
    if output:
        figures = {
            "pipeline": str(pipeline),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "load_average": load,
            "hidden_entry_points": hide_entry_points,
            "median": median,
            "runs": runs,
        }
        with atomic_open(output, "w") as f:
            f.write(json.dumps(figures, indent=2))


if __name__ == "__main__":
    app()
