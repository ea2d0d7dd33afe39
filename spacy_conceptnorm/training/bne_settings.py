"""A `train-bne` recipe: the settings of BNE training in a config file (configs/bne.cfg), as pydantic schemas.

    [training]   epochs, pairs_per_epoch, batch_size, lr, clip, holdout, seed, objectives, threads
    [network]    char_dim, char_hidden, word_hidden, out_dim, dropout
    [vectors]    the skip-gram settings used when no --vectors file is given: window, negative, min_count,
                 epochs, workers (their size is network.out_dim)

Every section and key is optional (the defaults are `TrainConfig`'s and `train_word_vectors`'s); types are
strict (an int is not a bool, a number is not a string), values are range-checked, unknown sections and keys are
errors, and a bad value is a ConceptNormError naming the file, the section and the key, as for the training
configs of `training.encoder_settings`. Data paths are not settings: they stay on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConceptNormError, Errors
from ..io.files import validation_problems
from .bne import TrainConfig

_STRICT = ConfigDict(extra="forbid", strict=True)


class TrainingSection(BaseModel):
    """[training]: see `TrainConfig`; `threads` is torch's thread count (0: torch's default)."""

    model_config = _STRICT

    epochs: int = Field(3, ge=1)
    pairs_per_epoch: int = Field(0, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    clip: float = Field(5.0, gt=0)
    holdout: int = Field(1000, ge=0)
    seed: int = 0
    objectives: list[Literal["syn", "def", "ctx"]] = Field(default_factory=lambda: ["syn", "def", "ctx"], min_length=1)
    threads: int = Field(1, ge=0)


class NetworkSection(BaseModel):
    """[network]: see `BNEConfig`."""

    model_config = _STRICT

    char_dim: int = Field(50, ge=1)
    char_hidden: int = Field(100, ge=1)
    word_hidden: int = Field(100, ge=1)
    out_dim: int = Field(200, ge=1)
    dropout: float = Field(0.5, ge=0, lt=1)


class VectorsSection(BaseModel):
    """[vectors]: skip-gram settings (see `train_word_vectors`)."""

    model_config = _STRICT

    window: int = Field(6, ge=1)
    negative: int = Field(5, ge=1)
    min_count: int = Field(1, ge=1)
    epochs: int = Field(10, ge=1)
    workers: int = Field(1, ge=1)


SECTIONS: dict[str, type[BaseModel]] = {"training": TrainingSection, "network": NetworkSection,
                                        "vectors": VectorsSection}  # fmt: skip


@dataclass
class Recipe:
    """train (TrainConfig): Training and network settings. word2vec (dict): Keyword arguments of
    `train_word_vectors`. threads (int): torch threads (0: leave torch's default)."""

    train: TrainConfig = field(default_factory=TrainConfig)
    word2vec: dict[str, int] = field(default_factory=lambda: VectorsSection().model_dump())
    threads: int = 1


def read_recipe(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Recipe:
    """The settings of a recipe file (None: the defaults), with dotted overrides applied before validation.

    path (Path): A config file such as configs/bne.cfg.
    overrides (dict): {"training.epochs": 2, ...}: the options given on the command line.
    RETURNS (Recipe): The validated settings.
    """
    where = str(path) if path is not None else "train-bne"
    raw: dict[str, dict[str, Any]] = {}
    if path is not None:
        from confection import ConfigValidationError
        from spacy.util import load_config

        if not Path(path).is_file():
            raise ConceptNormError(Errors.E982.format(path=path, detail="no such file"))
        try:
            raw = {k: dict(v) if isinstance(v, dict) else v for k, v in load_config(path, interpolate=True).items()}
        except (ConfigValidationError, ValueError, KeyError) as e:
            raise ConceptNormError(Errors.E701.format(detail=f"{path}: {str(e).strip()}")) from None
    for key, value in (overrides or {}).items():
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = value
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        detail = f"{where}: unknown section [{unknown[0]}] (the sections are {', '.join(SECTIONS)})"
        raise ConceptNormError(Errors.E701.format(detail=detail))
    sections = {name: _validate(schema, raw.get(name, {}), name, where) for name, schema in SECTIONS.items()}
    training = sections["training"].model_dump()
    threads = training.pop("threads")
    return Recipe(TrainConfig(**training, **sections["network"].model_dump()), sections["vectors"].model_dump(),
                  threads)  # fmt: skip


def _validate(schema: type[BaseModel], section: Any, name: str, where: str) -> BaseModel:
    if not isinstance(section, dict):
        raise ConceptNormError(Errors.E701.format(detail=f"{where}: [{name}] must be a section, got {section!r}"))
    try:
        return schema.model_validate(section)
    except ValidationError as e:
        problems = validation_problems(e)
        raise ConceptNormError(Errors.E701.format(detail=f"{where}: [{name}] {problems}")) from None
