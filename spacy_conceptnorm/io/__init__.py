"""Reading and writing: corpora (PubTator, BioC, JSONL), saved pipelines and their checksums, atomic files."""
