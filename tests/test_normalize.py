from spacy.util import registry

from spacy_conceptnorm.text.normalize import TextNormalizer


def test_default_normalization_folds_case_punctuation_space_and_accents():
    norm = TextNormalizer()
    assert norm("Colorectal Neoplasms, Hereditary Nonpolyposis") == "colorectal neoplasms hereditary nonpolyposis"
    assert norm("  Sjögren's   syndrome ") == "sjogren s syndrome"
    assert norm("Ｂｒｅａｓｔ cancer") == "breast cancer"  # full-width letters
    assert norm("type-2 diabetes") == "type 2 diabetes"
    assert norm("") == ""


def test_options_can_be_switched_off_and_the_normalizer_comes_from_the_registry():
    make = registry.misc.get("spacy_conceptnorm.TextNormalizer.v1")
    norm = make(lowercase=False, strip_punctuation=False, strip_accents=False)
    assert norm("Sjögren's  Syndrome") == "Sjögren's Syndrome"
