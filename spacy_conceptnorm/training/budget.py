"""Training budgets are steps; the wall clock is only a safety stop that warns.

A run's budget is its number of steps (`[training] max_steps` of `spacy train`, `max_epochs` and `max_steps` of the
name encoder's trainer), the same on every CPU: a faster machine finishes sooner, a slower one later, and both train
the same model for the same seed and precision. A budget in minutes would not: a recognizer step costs about twice
as long on a slow day of the same 2-core CPU, and three times as long without native bf16 (AVX2), so the steps, the
learning rate's decline and the scores followed the machine.

`max_minutes` stays as a safety stop for a run that would otherwise go on for hours (a machine far busier than
planned): when it fires, training ends before its last step and a `SafetyStopWarning` says so, since that model
differs from the one its steps give. 0 turns it off, as every shipped config has it, so that every machine trains
every step; a value is a stop you set for your own run.

    [training]
    max_steps = 800
    max_epochs = 20  # finite: once the safety stop fires the batcher yields nothing and the epochs run out

    [training.batcher]
    @batchers = "spacy_conceptnorm.batch_until.v1"
    max_minutes = 180
    [training.batcher.batcher]
    @batchers = "spacy.batch_by_padded.v1"
    ...

The clock starts when the batcher is built: spaCy's `train` builds it right before its loop, so the minutes count
the training steps and evaluations, not loading the data and initializing the model.
`spacy_conceptnorm.warmup_linear_until.v1`, whose decline used to end at `max_minutes` too, is thinc's
`warmup_linear.v1` now, kept for the configs that name it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from spacy.util import registry
from thinc.api import warmup_linear

from ..errors import Warnings

_now = time.monotonic  # the safety stop's clock (tests set their own)


class SafetyStopWarning(UserWarning):
    """A training run was ended by its wall-clock safety stop before its last step."""


def warn_safety_stop(what: str, setting: str, minutes: float, steps: int, planned: int | None = None) -> None:
    """Warn that `what` was stopped by its safety stop, so that a run cut short by the clock is never taken for one
    that trained its steps.

    what (str): The training that stopped, e.g. "spacy train". setting (str): The config key of the stop.
    minutes (float): Its value. steps (int): The steps trained. planned (Optional[int]): The steps of the budget.
    """
    done = f"{steps} step" if steps == 1 else f"{steps} steps"
    of = f" of the {planned} planned" if planned else ""
    message = Warnings.W003.format(what=what, setting=setting, minutes=minutes, steps=done, planned=of)
    warnings.warn(message, SafetyStopWarning, stacklevel=3)


@registry.batchers("spacy_conceptnorm.batch_until.v1")
def batch_until(batcher: Callable[[Iterable[Any]], Iterable[Any]], max_minutes: float) -> Callable:
    """`batcher`'s batches, with a safety stop: none after `max_minutes` since training began (0: no stop), with a
    `SafetyStopWarning` the first time it withholds one. The budget is `[training] max_steps`; this only ends a run
    that would take far longer than planned.

    batcher (Callable): The batcher to wrap, e.g. `spacy.batch_by_padded.v1`.
    max_minutes (float): Minutes of training after which no batch is given (0: no limit).
    """
    started = _now()
    given = 0  # batches given so far, over all epochs: spaCy calls the batcher once an epoch
    stopped = False

    def batches(items: Iterable[Any]) -> Iterator[Any]:
        nonlocal given, stopped
        for batch in batcher(items):
            if max_minutes and (_now() - started) / 60 >= max_minutes:
                if not stopped:
                    stopped = True
                    warn_safety_stop("spacy train", "[training.batcher] max_minutes", max_minutes, given)
                return
            given += 1
            yield batch

    return batches


@registry.schedules("spacy_conceptnorm.warmup_linear_until.v1")
def warmup_linear_until(
    initial_rate: float, warmup_steps: int, total_steps: int, max_minutes: float = 0
) -> Iterator[float]:
    """thinc's `warmup_linear.v1`: a linear warm-up over `warmup_steps`, then a linear decline to 0 at `total_steps`.
    Kept for configs that name it; its decline no longer ends early when `max_minutes` pass, so that the rate at each
    step is the same on every machine (the batcher's safety stop ends a run that runs out of time).

    initial_rate (float): The rate after warm-up. warmup_steps (int): Steps of warm-up.
    total_steps (int): The step at which the rate reaches 0. max_minutes (float): Accepted and unused.
    """
    return warmup_linear(initial_rate, warmup_steps, total_steps)
