__title__ = "spacy-conceptnorm"
__version__ = "0.1.0"
