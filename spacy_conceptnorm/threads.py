"""Process-wide settings, each installed only where the package may make it: a passive OpenMP wait policy, one thread
per forked worker for torch's and FAISS's OpenMP pools, and forked workers that die with their parent.

OpenMP wait policy. GNU OpenMP (torch's CPU runtime) keeps idle threads spinning between parallel regions; beside
another CPU-heavy process a spinning thread waits on one that is not scheduled, and the encoder slowed 3 to 19x in
our measurements (`python -m spacy_conceptnorm.benchmarks.contention`). `OMP_WAIT_POLICY=PASSIVE` lets them sleep,
at no measurable cost on an idle machine. The runtime reads the variable once, when torch loads, so the package sets
it (if unset) when it is imported before torch: the command line (`python -m spacy_conceptnorm`, the
`spacy-conceptnorm` script: annotate, train, evaluate, ...) and any program that imports `spacy_conceptnorm`
before spaCy or torch. Where torch is already loaded (`import spacy` loads it) nothing changes: export the
variable yourself.

`nlp.pipe(n_process=...)` forks on Linux, and GNU OpenMP cannot resume the parent's thread pool in a forked child:
its first parallel region hangs. Forked workers therefore run one torch and one FAISS thread each, as torch's
DataLoader workers do (the workers share the cores anyway).

This is a process-wide side effect, so it is not done at import: the first `NameEncoder` or `VectorIndex` installs
it, which every pipeline with a concept_normalizer builds before it can fork.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def passive_openmp_by_default() -> None:
    """Set OMP_WAIT_POLICY=PASSIVE unless it is set or torch (and its OpenMP runtime) is loaded already."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _one_thread() -> None:
    if "torch" in sys.modules:  # only what the parent had imported: nothing is imported in the child
        sys.modules["torch"].set_num_threads(1)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(1)


@functools.cache
def one_thread_in_forked_workers() -> None:
    """Install the fork hook (once per process)."""
    os.register_at_fork(after_in_child=_one_thread)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_parent: list[int] = []  # the pid whose forked children must die with it, while `workers_die_with_parent` is on


def _die_with_parent() -> None:
    """In a forked child: be killed when the parent dies (Linux: the kernel's parent-death signal; elsewhere a
    thread watching the parent's pid)."""
    if not _parent:
        return
    parent = _parent[-1]
    _parent.clear()  # the child's own children are its business
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was set
        os._exit(1)


@functools.cache
def _install_death_hook() -> None:
    os.register_at_fork(after_in_child=_die_with_parent)


@contextmanager
def workers_die_with_parent() -> Iterator[None]:
    """While the block runs, processes forked by this one (`nlp.pipe(n_process=...)`'s workers) are killed when
    it dies, even by SIGKILL: otherwise they wait on their pipes for minutes, holding their memory."""
    _install_death_hook()
    _parent.append(os.getpid())
    try:
        yield
    finally:
        _parent.pop()
