"""The second stage of linking: candidates (sieve + lexical), the ranker, and calibrated confidence."""

from .candidates import FEATURES, CandidateGenerator, CandidateSet
from .confidence import Confidence, expected_calibration_error, reliability
from .lexical import LexicalIndex
from .linker import Linker
from .pair_scorer import PairScorer, RankingGroup
from .ranker import Ranker, make_ranker

__all__ = [
    "FEATURES",
    "CandidateGenerator",
    "CandidateSet",
    "Confidence",
    "LexicalIndex",
    "Linker",
    "PairScorer",
    "RankingGroup",
    "Ranker",
    "expected_calibration_error",
    "make_ranker",
    "reliability",
]
