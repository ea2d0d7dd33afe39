"""Process-wide settings, each installed only where the package may make it: a passive OpenMP wait policy, no more
threads than the CPUs the process may use, one thread per forked worker for torch's and FAISS's OpenMP pools, and
forked workers that die with their parent.

OpenMP wait policy. GNU OpenMP (torch's CPU runtime) keeps idle threads spinning between parallel regions; beside
another CPU-heavy process a spinning thread waits on one that is not scheduled, and the encoder runs 3 to 19x
slower (docs/benchmarks.md). `OMP_WAIT_POLICY=PASSIVE` lets them sleep, at no
cost to see on an idle machine. The runtime reads the variable once, when torch loads, so the package sets
it (if unset) when it is imported before torch: the command line (`python -m spacy_conceptnorm`, the
`spacy-conceptnorm` script: annotate, train, evaluate, ...) and any program that imports `spacy_conceptnorm`
before spaCy or torch. Where torch is already loaded (`import spacy` loads it) the variable cannot take effect:
the encoder then runs on one thread while the machine is oversubscribed (`one_thread_if_oversubscribed`), and a
training run on one thread throughout when it starts on a busy machine (`training_threads`); export the variable
yourself to keep both threads.

CPU budget. torch and FAISS start one OpenMP thread per CPU in the process's affinity mask, but a container's CPU
quota (cgroup `cpu.max`, or `cpu.cfs_quota_us` in cgroup v1) may allow far fewer: 32 threads on a 2-CPU quota
spend their time throttled at barriers, and a forward pass that takes milliseconds takes seconds. Unless the user
chose a number (`OMP_NUM_THREADS`), the pools are cut to the budget, the quota rounded up.

`nlp.pipe(n_process=...)` forks on Linux, and GNU OpenMP cannot resume the parent's thread pool in a forked child:
its first parallel region hangs. Forked workers therefore run one torch and one FAISS thread each, as torch's
DataLoader workers do (the workers share the cores anyway).

These are process-wide side effects, so they are not made at import: the first `NameEncoder` or `VectorIndex`
installs them, which every pipeline with a concept_normalizer builds before it can fork.
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

_spinning: list[bool] = [False]  # torch was loaded before the package, its wait policy left to OpenMP's default


def passive_openmp_by_default() -> None:
    """Set OMP_WAIT_POLICY=PASSIVE unless it is set or torch (and its OpenMP runtime) is loaded already."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _spinning[0] = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ


def set_spinning(spinning: bool) -> None:
    """Say whether torch's OpenMP threads spin, which `passive_openmp_by_default` decides when the package is
    imported. The one-thread fallbacks (`one_thread_if_oversubscribed`, `training_threads`) act only while it is
    True: False turns them off, as the package ran before them (docs/benchmarks.md compares the two)."""
    _spinning[0] = spinning


@contextmanager
def one_thread_if_oversubscribed() -> Iterator[None]:
    """Run the block on one torch thread when torch's threads spin (loaded before the package, no wait policy
    chosen) and the machine is oversubscribed (1-minute load average above the CPU budget); else leave it alone.

    Spinning threads wait on threads that are not scheduled, so under load one thread encodes faster than two
    spinning ones (docs/benchmarks.md). fp32 encodings came out bitwise identical on one and two threads
    there, so the answer does not depend on the load.
    """
    torch = sys.modules.get("torch")
    if torch is None or not _spinning[0] or os.getloadavg()[0] <= cpu_budget():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def runnable_elsewhere(samples: int = 9, interval: float = 0.01) -> int:
    """Threads of other processes runnable now: the median over `samples` readings of the kernel's count of
    runnable threads (/proc/loadavg), less this one; 0 where /proc is absent. Unlike the load average, which
    takes about a minute to rise, it sees a process that has just started."""
    counts = []
    for i in range(samples):
        text = _read("/proc/loadavg")
        try:
            counts.append(int(text.split()[3].split("/")[0]) - 1)  # "0.52 0.61 0.70 3/412 1234": 3 runnable
        except (AttributeError, IndexError, ValueError):
            return 0
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, sorted(counts)[len(counts) // 2])


@contextmanager
def training_threads(chosen: int = 0) -> Iterator[int]:
    """Run a training loop on one fixed number of torch threads, yielded, restored afterwards: `chosen` when > 0;
    otherwise one when torch's threads spin (loaded before the package, no wait policy chosen) and the machine is
    oversubscribed as the run starts (other processes' runnable threads plus torch's exceed the CPU budget, or the
    load average does), else torch's count.

    Decided once per run, not per step: gradients differ in their last bits between one and two threads, so a run
    keeps one count throughout, and a resumed run passes its first count as
    `chosen`. docs/benchmarks.md has the measurements.
    """
    import torch

    before = torch.get_num_threads()
    budget = cpu_budget()
    if chosen <= 0 and _spinning[0] and max(os.getloadavg()[0], runnable_elsewhere() + before) > budget:
        chosen = 1
        print(
            f"Training on one thread: torch was loaded before spacy_conceptnorm (OpenMP's spinning waits) and the "
            f"machine is busy (more runnable threads than its {budget} CPUs). Export OMP_WAIT_POLICY=PASSIVE or "
            "import spacy_conceptnorm first to keep every thread.",
            file=sys.stderr,
        )
    if chosen > 0:
        torch.set_num_threads(chosen)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


CGROUP_V2_MAX = "/sys/fs/cgroup/cpu.max"  # "QUOTA PERIOD" or "max PERIOD"
CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"  # -1: no quota
CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_budget() -> int:
    """The CPUs this process may use: its affinity mask, lowered to the cgroup CPU quota (rounded up) if any."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    v2 = (_read(CGROUP_V2_MAX) or "").split()
    quota, period = (v2[0], v2[1]) if len(v2) == 2 else (_read(CGROUP_V1_QUOTA), _read(CGROUP_V1_PERIOD))
    try:
        quota_cpus = -(-int(quota) // int(period)) if int(quota) > 0 and int(period) > 0 else cpus  # ceil
    except (TypeError, ValueError):  # "max", a missing file, an unreadable value: no quota
        quota_cpus = cpus
    return max(1, min(cpus, quota_cpus))


def threads_within_budget() -> None:
    """Lower torch's and FAISS's thread counts to `cpu_budget()`, unless OMP_NUM_THREADS says how many."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    budget = cpu_budget()
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() > budget:
        torch.set_num_threads(budget)
    faiss = sys.modules.get("faiss")
    if faiss is not None and faiss.omp_get_max_threads() > budget:
        faiss.omp_set_num_threads(budget)


def _one_thread() -> None:
    if "torch" in sys.modules:  # only what the parent had imported: nothing is imported in the child
        sys.modules["torch"].set_num_threads(1)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(1)


@functools.cache
def install_thread_settings() -> None:
    """Keep this process's pools within its CPU budget and give forked workers one thread (once per process)."""
    threads_within_budget()
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
