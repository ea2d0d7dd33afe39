"""The plain settings of a training config, `[training]` and `[training.dev]`, as pydantic schemas.

Strict types (an int is not a bool, a number is not a string), ranges, and no unknown keys; a bad value is a
ConceptNormError naming the section and the key. See configs/train_xu_bethard.cfg for what each key does.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConceptNormError, Errors
from ..io.files import validation_problems
from ..search.sieve import parse_strategy

_STRICT = ConfigDict(extra="forbid", strict=True)


class TrainingSettings(BaseModel):
    """The plain keys of [training]."""

    model_config = _STRICT

    train_on: Literal["O", "OD"] = "O"
    domain: str | None = None
    domain_ratio: float = Field(1 / 3, ge=0)
    batch_size: int = Field(256, ge=1)
    micro_batch: int = Field(64, ge=1)
    max_epochs: int = Field(4, ge=1)
    max_steps: int = Field(0, ge=0)
    # the steps of the learning-rate schedule (0: the budget's, the lesser of max_steps and max_epochs' batches)
    schedule_steps: int = Field(0, ge=0)
    # a safety stop, not a budget: when it fires the run ends early with a SafetyStopWarning (0: none)
    max_minutes: float = Field(0.0, ge=0)
    patience: int = Field(2, ge=0)
    learning_rate: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    scheduler: str = "linear"
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = Field(0, ge=0)


class DevSettings(BaseModel):
    """The keys of [training.dev]."""

    model_config = _STRICT

    mentions: str | None = None
    domain: str | None = None
    strategy: str = "D-T+OD-T"
    threshold: float = Field(0.95, ge=-1, le=1)
    candidates: int = Field(10, ge=0)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        parse_strategy(value)  # a ConceptNormError (a ValueError) naming the strategy
        return value


Settings = TypeVar("Settings", TrainingSettings, DevSettings)


def read_settings(schema: type[Settings], section: dict[str, Any], name: str) -> Settings:
    """The settings of a config section; a ConceptNormError naming every bad key of `[name]`."""
    try:
        return schema.model_validate(section)
    except ValidationError as e:
        problems = validation_problems(e)
        raise ConceptNormError(Errors.E701.format(detail=f"[{name}] {problems}")) from None
