"""Triplet training of the name encoder (Xu & Bethard 2021; DILBERT and CODER++ sampling strategies).

    spacy-conceptnorm train configs/train_xu_bethard.cfg --output training/xu-bethard [--training.x y] [--resume]

`data` builds the training texts (Train:O, Train:OD), `samplers` the batches, `losses` the registered losses,
`trainer` runs it all. The trained directory is a transformers model: `NameEncoder(path)` loads it.
"""

from .data import TrainingData, build_training_data
from .losses import batch_hard_soft_margin, multi_similarity, triplet_margin
from .samplers import STRATEGIES, Batch, TripletSampler
from .trainer import train

__all__ = [
    "STRATEGIES",
    "Batch",
    "TrainingData",
    "TripletSampler",
    "batch_hard_soft_margin",
    "build_training_data",
    "multi_similarity",
    "train",
    "triplet_margin",
]
