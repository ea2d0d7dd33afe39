"""A wall-time budget for `spacy train`: training stops after `max_minutes`, and the learning rate's linear decline
ends there, so the run finishes at a rate of 0 wherever the budget, not the step count, runs out first. A
recognizer step costs about three times as long on a CPU without native bf16 (AVX2) as on one with it: a step
count alone cannot hold `spacy project run all` to its time on every machine.

    [training]
    max_epochs = 20  # finite: once the time is up the batcher yields nothing and spaCy's loop runs out of epochs

    [training.batcher]
    @batchers = "spacy_conceptnorm.batch_until.v1"
    max_minutes = 30
    [training.batcher.batcher]
    @batchers = "spacy.batch_by_padded.v1"
    ...

    [training.optimizer.learn_rate]
    @schedules = "spacy_conceptnorm.warmup_linear_until.v1"
    initial_rate = 0.0001
    warmup_steps = 60
    total_steps = ${training.max_steps}
    max_minutes = 30

Both read one clock, restarted whenever either is built: spaCy's `train` builds the two right before its loop, so
the minutes count the training steps and evaluations, not loading the data and initializing the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from spacy.util import registry
from thinc.api import warmup_linear

_now = time.monotonic
_started = _now()


def _restart_clock() -> None:
    global _started
    _started = _now()


def _minutes_elapsed() -> float:
    return (_now() - _started) / 60


@registry.batchers("spacy_conceptnorm.batch_until.v1")
def batch_until(batcher: Callable[[Iterable[Any]], Iterable[Any]], max_minutes: float) -> Callable:
    """`batcher`'s batches until `max_minutes` have passed since training began (0: no limit).

    batcher (Callable): The batcher to wrap, e.g. `spacy.batch_by_padded.v1`.
    max_minutes (float): The training's wall-time budget in minutes.
    """
    _restart_clock()

    def batches(items: Iterable[Any]) -> Iterator[Any]:
        for batch in batcher(items):
            if max_minutes and _minutes_elapsed() >= max_minutes:
                return
            yield batch

    return batches


@registry.schedules("spacy_conceptnorm.warmup_linear_until.v1")
def warmup_linear_until(
    initial_rate: float, warmup_steps: int, total_steps: int, max_minutes: float
) -> Iterator[float]:
    """thinc's `warmup_linear.v1` (a linear warm-up over `warmup_steps`, then a linear decline to 0) whose decline
    ends at `total_steps` or after `max_minutes` of training, whichever comes first (0: no time limit).

    initial_rate (float): The rate after warm-up. warmup_steps (int): Steps of warm-up.
    total_steps (int): The step at which the rate reaches 0. max_minutes (float): The training's wall-time budget.
    """
    _restart_clock()
    rates = warmup_linear(initial_rate, warmup_steps, total_steps)
    if not max_minutes:
        return rates
    return (min(rate, initial_rate * max(0.0, 1 - _minutes_elapsed() / max_minutes)) for rate in rates)
