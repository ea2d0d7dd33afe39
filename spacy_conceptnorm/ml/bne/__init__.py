"""BNE, the Biomedical Name Encoder of Phan, Sun & Joty (ACL 2019): a character and word BiLSTM trained on a
dictionary's synonym sets with synonym, concept and context objectives, over frozen skip-gram word vectors.

    from spacy_conceptnorm.ml.bne import BNEEncoder
    encoder = BNEEncoder.load("training/bne")
    vectors = encoder.encode(["heart attack", "myocardial infarction"])  # unit rows, float32

Modules: `vocab` (names to inputs), `model` (the network), `encoder` (save/load, the registered encoder) and
`inference` (the fast encoding pass). Its training lives in `training.bne` (with `bne_objectives`, `bne_data`,
`word_vectors` and the `train-bne` recipe in `bne_settings`), its evaluation in `evaluation.bne_metrics` (the paper's
coverage@k, MAP and nearest-name accuracy) and `evaluation.similarity` (Spearman's rho against human similarity
scores, section 4.4).
"""

from .encoder import BNEEncoder, make_bne_encoder

__all__ = ["BNEEncoder", "make_bne_encoder"]
