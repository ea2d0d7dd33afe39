__title__ = "spacy-conceptnorm"
__version__ = "0.2.0"
