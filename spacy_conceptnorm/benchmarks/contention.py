"""Encoder speed beside a CPU-heavy process: the OpenMP wait policy before and after the package's default.

    python -m spacy_conceptnorm.benchmarks.contention [--names 600] [--hogs 1] [--repeats 3]

Each run is a fresh process that encodes `--names` names of the MEDIC test sample with the packaged
all-MiniLM-L6-v2 (fp32, torch's default threads), started five ways: "torch first" imports torch before the
package, as `import spacy` does (GNU OpenMP's default, spinning waits), with the package's rule for that case (one
thread while the load average exceeds the CPUs), without it (the behaviour before), and on one thread throughout;
"package first" imports spacy_conceptnorm first (its default, OMP_WAIT_POLICY=PASSIVE, as on the command line),
and "PASSIVE" exports the variable. Each is timed alone and beside `--hogs` busy-looping processes, in
turn, `--repeats` times; the table gives the median names/second.
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
from spacy_conceptnorm.encoder import NameEncoder
from spacy_conceptnorm.kb import load_kb
names = load_kb({sample!r}).names()[:{n}]
encoder = NameEncoder(precision="fp32")
encoder.encode(names[:16])
start = time.perf_counter()
encoder.encode(names)
print(len(names) / (time.perf_counter() - start), os.environ.get("OMP_WAIT_POLICY", "unset"), torch.get_num_threads())
"""
SETUPS = {
    "torch first, spinning (before)": ("import torch, spacy_conceptnorm.threads as t; t._spinning[0] = False", {}),
    "torch first (one thread when oversubscribed)": ("import torch", {}),
    "torch first, one thread": ("import torch; torch.set_num_threads(1)", {}),
    "package first": ("import spacy_conceptnorm", {}),
    "OMP_WAIT_POLICY=PASSIVE": ("import torch", {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def run(first: str, env: dict, n: int) -> tuple[float, str]:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env | {"HF_HUB_OFFLINE": "1"}
    code = CHILD.format(first=first, sample=str(SAMPLE), n=n)
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    rate, policy, threads = out.stdout.split()[-3:]
    return float(rate), f"{policy}, {threads} threads"


@app.command()
def main(names: int = 600, hogs: int = 1, repeats: int = 3) -> None:
    rates: dict[tuple[str, bool], list[float]] = {}
    policies = {}
    for _ in range(repeats):
        for busy in (False, True):
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs if busy else 0)]
            try:
                for label, (first, env) in SETUPS.items():
                    rate, policies[label] = run(first, env, names)
                    rates.setdefault((label, busy), []).append(rate)
            finally:
                for proc in procs:
                    proc.kill()
                    proc.wait()
    typer.echo(f"| start | wait policy | names/s alone | names/s beside {hogs} busy process(es) |")
    typer.echo("|---|---|---|---|")
    for label in SETUPS:
        alone, busy = (statistics.median(rates[label, b]) for b in (False, True))
        typer.echo(f"| {label} | {policies[label]} | {alone:.0f} | {busy:.0f} |")


if __name__ == "__main__":
    app()
