"""Command line: `python -m spacy_conceptnorm <command>` (also installed as `spacy-conceptnorm`).

One module per command group, as in spaCy's `spacy.cli`: importing a module registers its commands on `app` (the
`benchmark` group's on `benchmark_cli`). Each command imports what it needs when it runs, so that the command line
starts without loading spaCy, torch or FAISS.
"""

from . import (  # noqa: F401  (importing a command module registers its commands)
    annotate,
    benchmark_speed,
    benchmark_throughput,
    benchmark_weight,
    cluster,
    evaluate,
    kb,
    pipeline,
    preprocess,
    serve,
    train,
)
from ._util import app, benchmark_cli, main

__all__ = ["app", "benchmark_cli", "main"]
