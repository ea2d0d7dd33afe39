"""Benchmarks run as modules from the repository root (`python -m benchmarks.ncbi`), most of them on the NCBI-disease
and MEDIC files; not installed with the package. Those that measure any pipeline are commands of the package:
`python -m spacy_conceptnorm benchmark speed|throughput|weight` (spacy_conceptnorm.cli.benchmark_speed,
benchmark_throughput, benchmark_weight)."""
