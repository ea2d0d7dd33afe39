"""Batch annotation: `python -m spacy_conceptnorm annotate MODEL INPUT OUTPUT`.

Documents stream from INPUT through `nlp.pipe` and are appended to OUTPUT one batch at a time, so memory stays
constant (apart from the set of document ids). A first Ctrl-C stops reading input, finishes and writes the documents
in flight, then exits; a second stops at once. Either way OUTPUT holds complete records (and at worst a half-written
last one, which the next run cuts off before it appends the documents still missing).

Input formats (`--input-format`, else guessed from INPUT):
- "jsonl": one `{"id": ..., "text": ...}` object per line (id a string or an integer);
- "pubtator": title/abstract blocks (`PMID|t|title`, `PMID|a|abstract`, annotation lines ignored) separated by
  blank lines; the text is title + "\\n" + abstract, so offsets follow the PubTator convention;
- "txt": a .txt file is one document per non-blank line, id `<file name>:<line number>`; a directory is one
  document per .txt file below it, id = its path relative to the directory, text = the whole file.
Output formats (`--output-format`, else from OUTPUT's extension): "jsonl" (.jsonl), one object per document
(see `entity_record`), or "pubtator" (.pubtator, .txt): per document a title line (text up to its first newline),
an abstract line (the rest, newlines written as spaces so offsets hold), `PMID\\tstart\\tend\\ttext\\tlabel\\tid`
lines and a blank line. PubTator is read and written by `spacy_conceptnorm.io.corpus`, as for the gold corpora.

Ids are compared as strings. A record whose id was seen before in the input is a duplicate: warned about and
skipped. A text longer than `nlp.max_length` is annotated in pieces cut at newlines (else spaces) and merged back.

With `--engine ray` (`annotate_ray`, module `ray_engine`) the documents are annotated by Ray Data actors, on this
machine or a Ray cluster, in shards kept in OUTPUT.parts until all are done, then merged into OUTPUT: the same
records as the local engine, resumed shard by shard.

One idea per module: `readers` (input formats), `writers` (output formats), `resume` (what OUTPUT already
holds), `interrupt` (Ctrl-C), `run` (the loop that ties them together), `ray_engine` (the same on Ray).
"""

from .ray_engine import RaySummary, annotate_ray, parts_dir
from .readers import INPUT_FORMATS, READERS, detect_input_format, read_jsonl, read_pubtator, read_txt
from .resume import read_done_ids
from .run import Summary, annotate, split_text
from .writers import OUTPUT_FORMATS, WRITERS, detect_output_format, entity_record, jsonl_record, pubtator_record

__all__ = [
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "READERS",
    "WRITERS",
    "RaySummary",
    "Summary",
    "annotate",
    "annotate_ray",
    "detect_input_format",
    "detect_output_format",
    "entity_record",
    "jsonl_record",
    "parts_dir",
    "pubtator_record",
    "read_done_ids",
    "read_jsonl",
    "read_pubtator",
    "read_txt",
    "split_text",
]
