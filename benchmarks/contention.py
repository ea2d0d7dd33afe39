"""Encoder (or training) speed beside a CPU-heavy process: the OpenMP wait policy before and after our default.

    python -m benchmarks.contention [--names 600] [--hogs 1] [--repeats 3] [--task train]

Each run is a fresh process that encodes `--names` names of the MEDIC test sample with the packaged
all-MiniLM-L6-v2 (fp32, torch's default threads) or, with `--task train`, takes training steps on batches of 64 of
them (forward, backward, AdamW, inside `ml.threads.training_threads()` as `train` runs them). It starts five ways:
"torch first" imports torch before the package, as `import spacy` does (GNU OpenMP's default, spinning waits), with
the package's rule for that case (one thread while the load average exceeds the CPUs; for training, decided as the
run starts), without it (the behaviour before), and on one thread throughout; "package first" imports
spacy_conceptnorm first (its default, OMP_WAIT_POLICY=PASSIVE, as on the command line), and "PASSIVE" exports the
variable. Each is timed alone and beside `--hogs` busy-looping processes, in turn, `--repeats` times; the table
gives the median names (or steps) per second.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False)

SAMPLE = Path(__file__).parents[2] / "tests" / "fixtures" / "medic_sample.txt"
CHILD = """
import os, sys, time
{first}
import torch
from spacy_conceptnorm.ml.name_encoder import NameEncoder
from spacy_conceptnorm.kb.knowledge_base import load_kb
names = load_kb({sample!r}).names()[:{n}]
encoder = NameEncoder(precision="fp32")
{task}
print(rate, os.environ.get("OMP_WAIT_POLICY", "unset"), threads)
"""
TASKS = {
    "encode": """encoder.encode(names[:16])
start = time.perf_counter()
encoder.encode(names)
rate, threads = len(names) / (time.perf_counter() - start), torch.get_num_threads()""",
    "train": """from spacy_conceptnorm.ml.threads import training_threads
model = encoder.model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
batches = [encoder.tokenizer(names[i : i + 64], padding=True, return_tensors="pt") for i in range(0, len(names), 64)]
def step(batch):
    optimizer.zero_grad()
    out = model(**batch).last_hidden_state.mean(1)
    (out @ out.T).pow(2).mean().backward()
    optimizer.step()
with training_threads() as threads:
    step(batches[0])
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    rate = len(batches) / (time.perf_counter() - start)""",
}
SETUPS = {
    "torch first, spinning (before)": ("import torch, spacy_conceptnorm.ml.threads as t; t.set_spinning(False)", {}),
    "torch first (one thread when oversubscribed)": ("import torch", {}),
    "torch first, one thread": ("import torch; torch.set_num_threads(1)", {}),
    "package first": ("import spacy_conceptnorm", {}),
    "OMP_WAIT_POLICY=PASSIVE": ("import torch", {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def run(first: str, env: dict, n: int, task: str) -> tuple[float, str]:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env | {"HF_HUB_OFFLINE": "1"}
    code = CHILD.format(first=first, sample=str(SAMPLE), n=n, task=TASKS[task])
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    rate, policy, threads = out.stdout.split()[-3:]
    return float(rate), f"{policy}, {threads} threads"


@app.command()
def main(names: int = 600, hogs: int = 1, repeats: int = 3, task: str = "encode") -> None:
    if task not in TASKS:
        raise typer.BadParameter(f"--task must be one of {sorted(TASKS)}, not {task!r}")
    rates: dict[tuple[str, bool], list[float]] = {}
    policies = {}
    for _ in range(repeats):
        for busy in (False, True):
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs if busy else 0)]
            try:
                for label, (first, env) in SETUPS.items():
                    rate, policies[label] = run(first, env, names, task)
                    rates.setdefault((label, busy), []).append(rate)
            finally:
                for proc in procs:
                    proc.kill()
                    proc.wait()
    unit = "names/s" if task == "encode" else "steps/s"
    typer.echo(f"| start | wait policy | {unit} alone | {unit} beside {hogs} busy process(es) |")
    typer.echo("|---|---|---|---|")
    for label in SETUPS:
        alone, busy = (statistics.median(rates[label, b]) for b in (False, True))
        typer.echo(f"| {label} | {policies[label]} | {alone:.3g} | {busy:.3g} |")


if __name__ == "__main__":
    app()
