"""Benchmarks run as modules: `python -m spacy_conceptnorm.benchmarks.ncbi`."""
