"""Ctrl-C during the `annotate` command: a first one asks for a clean stop, a second one stops at once."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_sigint(stop: list[BaseException]) -> Iterator[None]:
    """A first Ctrl-C appends to `stop`, which asks the run to read no more input and finish the documents in
    flight; a second one stops at once. Raising inside `nlp.pipe(n_process>1)` would leave its workers blocked on
    their pipes while it waits for them, so the second Ctrl-C ends them first. (Forked workers inherit the
    handler: there it changes nothing.) Outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if stop:
            for child in multiprocessing.active_children():
                child.terminate()
            raise KeyboardInterrupt
        stop.append(KeyboardInterrupt())

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
