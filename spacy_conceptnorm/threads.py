"""One thread per forked worker for torch's and FAISS's OpenMP pools.

`nlp.pipe(n_process=...)` forks on Linux, and GNU OpenMP cannot resume the parent's thread pool in a forked child:
its first parallel region hangs. Forked workers therefore run one torch and one FAISS thread each, as torch's
DataLoader workers do (the workers share the cores anyway).

This is a process-wide side effect, so it is not done at import: the first `NameEncoder` or `VectorIndex` installs
it, which every pipeline with a concept_normalizer builds before it can fork.
"""

from __future__ import annotations

import functools
import os
import sys


def _one_thread() -> None:
    if "torch" in sys.modules:  # only what the parent had imported: nothing is imported in the child
        sys.modules["torch"].set_num_threads(1)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(1)


@functools.cache
def one_thread_in_forked_workers() -> None:
    """Install the fork hook (once per process)."""
    os.register_at_fork(after_in_child=_one_thread)
