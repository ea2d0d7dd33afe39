"""BNE, the Biomedical Name Encoder of Phan, Sun & Joty (ACL 2019): a character and word BiLSTM trained on a
dictionary's synonym sets with synonym, concept and context objectives, over frozen skip-gram word vectors.

    from spacy_conceptnorm.bne import BNEEncoder
    encoder = BNEEncoder.load("training/bne")
    vectors = encoder.encode(["heart attack", "myocardial infarction"])  # unit rows, float32

Modules: `vocab` (names to inputs), `model` (the network), `objectives` (the losses), `data` (synonym sets and
batches), `vectors` (word2vec vectors), `train`, `settings` (the `train-bne` recipe, configs/bne.cfg), `encoder`
(save/load, the registered encoder), `inference` (the fast encoding pass), `evaluate` (the paper's coverage@k, MAP
and nearest-name accuracy) and `similarity` (Spearman's rho against human similarity scores, section 4.4).
"""

from .encoder import BNEEncoder, make_bne_encoder
from .train import TrainConfig, train_bne
from .vectors import WordVectors, text_sentences, train_word_vectors

__all__ = ["BNEEncoder", "TrainConfig", "WordVectors", "make_bne_encoder", "text_sentences", "train_bne",
           "train_word_vectors"]  # fmt: skip
