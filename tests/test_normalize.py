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


def test_ascii_text_skips_unicode_normalization_with_the_same_result():
    """ASCII is unchanged by every Unicode form and has no combining marks, so the shortcut changes nothing."""
    import unicodedata

    ascii_text = "".join(map(chr, range(128))) + " Colorectal Neoplasms, Hereditary (type-2) "
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        assert unicodedata.normalize(form, ascii_text) == ascii_text
    assert not any(unicodedata.combining(c) for c in ascii_text)
    norm = TextNormalizer()
    assert norm(ascii_text) == norm(ascii_text + "\u0301").strip()  # a combining mark alone takes the slow path
    assert norm("Sjögren's Syndrome") == "sjogren s syndrome"  # non-ASCII text is still normalized
