"""Every error and warning message of the package, in one place (as spaCy's `spacy.errors`): reading an attribute
gives the message with its code in front, "[E301] The concept_normalizer has no knowledge base. ..."."""

from spacy.errors import ErrorsWithCodes


class Errors(metaclass=ErrorsWithCodes):
    # knowledge base and loaders
    E001 = "{path}:{line}: malformed line ({reason}): {text!r}"
    E002 = "Knowledge base file not found: {path}"
    E003 = (
        "{path} is not a valid saved {what} (format version {found!r}, expected {expected!r}). "
        "Was it written by a different version of spacy_conceptnorm?"
    )
    E004 = "Cannot read {path}: the file is truncated or corrupt ({detail})."
    E005 = "{path} could not be decoded as {encoding} at byte {position}: {detail}"
    E006 = "Unknown concept id {concept_id!r}: add the concept to the knowledge base first."
    E007 = "Unknown knowledge base format {fmt!r}; choose one of {choices}."
    E008 = "Empty name for concept {concept_id!r}."
    E009 = "unicode_form must be one of {choices}, got {value!r}."
    # encoder and index
    E101 = (
        "Cannot load the encoder model {model!r}: {detail}. Give a local transformers model directory "
        "or an id already in the Hugging Face cache (no network access is attempted when HF_HUB_OFFLINE=1)."
    )
    E102 = "Unknown pooling {pooling!r}; choose 'mean' or 'cls'."
    E103 = "Unknown index type {index_type!r}; choose one of {choices}."
    E104 = "Vector dimension mismatch: the index holds {expected}-d vectors, got {found}-d."
    E105 = "Unknown precision {precision!r}; choose 'auto', 'fp32', 'bf16' or 'fp16'."
    # vector store and indexes at scale
    E106 = "{vectors} vectors given for {ids} ids: give one vector per id."
    E107 = "VectorIndex.add: {rows} ids without vectors, and the index is not on a VectorStore to read them from."
    E108 = (
        "SieveSearcher.build: {found} vectors given for {expected} names: give one row per name of kb.names(), "
        "in that order."
    )
    # encoder runtime
    E130 = "Unknown encoder runtime {runtime!r}; choose 'torch', 'onnx' or 'auto'."
    E131 = "The encoder's runtime 'onnx' needs the {module} package ({detail}): pip install 'spacy-conceptnorm[onnx]'."
    E132 = "The encoder's runtime 'onnx' computes in fp32: precision {precision!r} needs runtime 'torch'."
    # search
    E201 = (
        "Invalid search strategy {strategy!r}: write stages as TARGET-REPR joined by '+', e.g. 'D-T+OD-T', "
        "with TARGET in O, D, OD and REPR in T, C."
    )
    E202 = "top_k must be a positive integer, got {top_k!r}."
    # component
    E301 = (
        "The concept_normalizer has no knowledge base. Call nlp.initialize() with "
        "[initialize.components.{name}.kb] set, or normalizer.initialize(nlp=nlp, kb=kb) first."
    )
    E302 = (
        "Saved concept_normalizer data in {path} do not match: {detail}. "
        "Re-run nlp.initialize() and save the pipeline again."
    )
    E303 = "Synonyms must be (text, concept_id) pairs, got {item!r}."
    E304 = "concept_normalizer: {key} must be {expected}, got {value!r}."
    E305 = "concept_normalizer: unknown index setting(s) {keys}; choose from {choices}."
    E310 = "Unknown ranker model {model!r}; choose one of {choices}."
    E311 = "The ranker's {key} must be a positive integer, got {value!r}."
    E312 = "No training mention has its gold concept among its candidates: the ranker cannot be trained."
    E313 = "The confidence model needs right and wrong links to fit, got {right} right and {wrong} wrong."
    E315 = "Ranker scorer {name!r} must be a PairScorer (e.g. spacy_conceptnorm.cnn_ranker.v1), got {found}."
    E314 = "The concept_normalizer has no ranker to train: set [components.concept_normalizer.ranker] in its config."
    E316 = "The ranker's ngram_range must be two integers 1 <= low <= high (character n-gram sizes), got {value!r}."
    E317 = "Unknown cpu_precision {precision!r} of the recognizer's transformer: choose 'auto', 'bf16' or 'fp32'."
    E318 = (
        "The ranker's scorers may not be named 'confidence_scorer' while it has a confidence scorer: train-ranker "
        "fits and reports that one under the name."
    )
    # abbreviations
    E401 = "Unknown abbreviation detector {detector!r}; choose one of {choices}."
    E402 = (
        "The 'ab3p' abbreviation detector needs the pyab3p package: pip install pyab3p "
        "(or pip install 'spacy-conceptnorm[ab3p]'), or use detector = \"schwartz_hearst\"."
    )
    # entity recognition: dictionary matcher, link filter
    E410 = "{component}: {key} must be {expected}, got {value!r}."
    E411 = "{path} is not a valid saved dictionary_matcher ({detail}). Save the pipeline again with nlp.to_disk()."
    E412 = "{path} is not a valid saved link_filter ({detail}). Save the pipeline again with nlp.to_disk()."
    E413 = "{path} is not a valid saved clinical_findings ({detail}). Save the pipeline again with nlp.to_disk()."
    # composites
    E501 = "composite_splitter: {key} must be a list of non-empty strings, got {value!r}."
    E502 = "composite_splitter: split_interventions must be true or false, got {value!r}."
    E503 = "{path} is not a valid saved composite_splitter ({detail}). Save the pipeline again with nlp.to_disk()."
    E504 = "split_composite expects the mention text as a str, got {value!r}."
    # training
    E701 = "Invalid training config: {detail}"
    E702 = "Unknown sampling strategy {strategy!r}; choose one of {choices}."
    E703 = "The {strategy!r} strategy needs a concept hierarchy: set [training.sampler] hierarchy (a CTD diseases TSV)."
    E704 = "No training anchors: no concept has two or more names in {source}, so no triplet can be formed."
    E705 = "Cannot resume: no checkpoint in {path} (run without --resume to start afresh)."
    E706 = "train_on must be 'O' (ontology synonyms) or 'OD' (plus annotated mentions), got {value!r}."
    E707 = "Cannot read annotated mentions from {path}: give a PubTator file, a .spacy DocBin or a folder of them."
    E708 = "{path} holds no mention whose concept id is in the knowledge base; check the file and the ontology."
    E709 = "batch_size {batch_size} is too small for the {strategy!r} sampler: one anchor's group needs {needed} names."
    E710 = "The checkpoint in {path} is unreadable or does not match this config ({detail})."
    E711 = "{what} must give {expected}, got {found}: register the function with @spacy.registry.misc."
    # second-stage pair scorers: the CNN ranker (linking/cnn_ranker.py) and the cross-encoder (linking/cross_encoder.py)
    E720 = "Cannot load the embedding model {model!r} of the CNN ranker: {detail}"
    E721 = "The CNN ranker's {key} must be {expected}, got {value!r}."
    E722 = "{path} does not match the CNN ranker's config in {config}: {detail}."
    E723 = "The pair scorer {scorer} has no trainer: give it a fit(groups, dev, *, seed, log) method."
    E730 = "Cannot load the cross-encoder model {model!r}: {detail}"
    E731 = "The cross-encoder ranker's {key} must be {expected}, got {value!r}."
    E732 = "Cannot load the cross-encoder saved in {path}: {file} is unreadable ({detail})."
    # evaluation and data
    E601 = "{path}: document {pmid}: annotation {start}-{end} {text!r} does not match the document text."
    E602 = "{path}: cannot parse PubTator ({detail})."
    E603 = "{path} holds no PubTator document: nothing to convert (is it the right file?)."
    # clinical documents: assertion status (clinical_context) and its evaluation
    E620 = "{component} needs medSpaCy's components, which could not be imported ({error}). Install them: {install}"
    E621 = (
        "{component} was set not to split sentences (split_sentences = false), but the doc has none: put a parser "
        "or senter before it, or let it split them."
    )
    E622 = "{path}:{line}: not an assertion record ({detail})."
    E624 = "{component}: unknown sentence splitter {value!r}; choose one of {choices}."
    E623 = "{path} holds no assertion record: nothing to evaluate."
    E626 = (
        "{path}:{line}: the span {start}-{end} overlaps another once widened to whole tokens: a doc's entities "
        "cannot overlap."
    )
    E627 = "The {which} pipeline has no component named 'ner' (it has {names}): no recognizer to replace."
    E625 = (
        "The ConText rule {rule!r} has a regular expression for its pattern or an on_match callback, which "
        "clinical_context's cue matcher does not run: give it a literal or a token pattern."
    )
    # annotate command (E801 is a warning, or an error with --strict; E806 is a warning)
    E801 = "{path}:{line}: {problem}"
    E802 = "Unknown {what} format {fmt!r}; choose one of {choices}."
    E803 = "Cannot tell the output format from {path}: name it .jsonl or .pubtator, or give --output-format."
    E804 = "Input not found: {path}"
    E805 = (
        "{path}:{line}: expected {expected}: this file was not written by `annotate` in this format, so it is not "
        "appended to. Move it away or choose another output file or --output-format."
    )
    E806 = "{path} ended in a half-written record (an interrupted run): removed its last {count} bytes."
    E807 = "{path} is a directory: it is read as .txt files, so --input-format must be 'txt' or 'auto', not {fmt!r}."
    E808 = "Further input problems are only counted in the summary."
    E809 = (
        "Document {id!r} has {length} characters, more than nlp.max_length ({limit}): annotated in {pieces} pieces "
        "cut at line breaks (else spaces); an abbreviation defined in one piece is not resolved in the others."
    )
    # evaluate and calibrate
    E901 = "Gold data not found: {path} (give a .spacy DocBin or a PubTator file)."
    E902 = "{what} holds no gold entity with a concept id: nothing to evaluate."
    E903 = "{model} has no concept_normalizer component (its components: {names})."
    E904 = "Pipeline directory not found: {path}"
    E905 = "Unknown NIL threshold strategy {strategy!r}; choose one of {choices}."
    E906 = (
        "Cannot calibrate a NIL threshold: it needs correctly linked in-KB mentions and out-of-KB mentions, "
        "got {tp} and {out}. Use more dev data or a larger holdout."
    )
    E907 = "holdout must be a fraction strictly between 0 and 1, got {value!r}."
    # term clustering (cluster command)
    E950 = "{name} must be a cosine in [-1, 1], got {value!r}."
    E951 = "top_m must be a positive integer (neighbours searched per term), got {value!r}."
    E952 = "{path} holds {what}: nothing to cluster."
    E953 = "{path}:{line}: not an `annotate` JSONL record with an 'entities' list ({detail}): {text!r}"
    E954 = "Unknown clustering input format {fmt!r}; choose one of {choices}."
    E955 = "Unknown policy for names of several concepts {value!r}; choose one of {choices}."
    E956 = "Gold labels and terms differ in number: {gold} labels for {n} terms."
    E957 = "Terms file not found: {path}"
    # BNE name encoder (spacy_conceptnorm.ml.bne)
    E960 = "Cannot load the BNE encoder: {path} {detail}."
    E961 = "{path}: not a word2vec text file of word vectors ({detail})."
    E962 = "BNE training needs concepts with two or more names; {what} has none (after the held-out concepts)."
    E963 = (
        "Training word vectors needs gensim: pip install gensim (or 'spacy-conceptnorm[bne]'), or give "
        "--vectors with word2vec text-format vectors."
    )
    E964 = "{name} must be {expected}, got {value!r}."
    E965 = "Term-pair file not found: {path}"
    E966 = "{path}: no column {column!r} for {what} (matched exactly, else ignoring case); the header is {header}."
    E967 = "{path}:{line}: {detail} (without --strict such a row is skipped and counted)."
    E968 = "{path}: {n} usable term pairs ({skipped} rows skipped): Spearman's rho needs at least 2."
    # reliability: checksums, corrupt files, synonyms, annotate's output
    E980 = (
        "{path} is truncated or corrupt: its checksum (sha256) differs from the one recorded in {manifest} when "
        "the pipeline was saved. Restore the file or save the pipeline again (or set "
        "SPACY_CONCEPTNORM_SKIP_CHECKSUMS=1 to load without checking)."
    )
    E981 = "{path} was saved with checksums but its checksum list {manifest} is {problem}."
    E982 = "Cannot read {path}: {detail}."
    E983 = (
        "{path} holds no concept (format {fmt!r}): an empty knowledge base would link every mention to NIL. "
        "Check the file, its format and filters."
    )
    E984 = "{path} not found: it was saved with the pipeline (listed in {manifest}). Restore it or save it again."
    E985 = "Synonyms to remove must be texts or (text, concept_id or None) pairs, got {item!r}."
    E986 = "Cannot write the output {path}: {detail}."
    E987 = (
        "An `annotate` worker process failed: {detail}. The documents finished before it are in {path}; "
        "run the command again to resume."
    )
    E988 = (
        "spaCy could not load the pipeline {pipeline}: it failed reading {path} ({detail}). If that file is missing, "
        "truncated or corrupt, restore it or save the pipeline again."
    )
    # annotate --engine ray
    E989 = (
        "{path} is truncated or corrupt: its checksum (crc32) differs from the one recorded when it was saved. "
        "Restore the file or save the pipeline again."
    )
    E990 = "annotate --engine ray needs Ray Data: pip install 'spacy-conceptnorm[ray]' (or 'ray[data]')."
    E991 = (
        "{path} is not a manifest that `annotate --engine ray` can resume from ({detail}). Move its directory away "
        "to start the shards over."
    )
    E992 = "{name} must be {expected}, got {value!r}."
    E993 = "Cannot connect to the Ray cluster at {address!r}: {detail}"
    E994 = (
        "`annotate --engine ray` failed: {detail}. The finished shards are kept in {path}; run the command again "
        "to resume."
    )
    E995 = (
        "Shards {shards} did not come back complete from Ray. The finished shards are kept in {path}; run the "
        "command again to resume."
    )
    E996 = "{options}: not an option of --engine {engine}."
    E997 = "Unknown engine {engine!r}; choose 'local' or 'ray'."
    # curation server (serve command)
    E970 = (
        "Refusing to serve on {host!r} without a token: anyone who can reach that address could change the "
        "reviews and the pipeline. Give --token (or CONCEPTNORM_TOKEN), or bind to 127.0.0.1."
    )
    E971 = "{path}:{line}: not an `annotate` JSONL record ({detail})."
    E972 = "{path}:{line}: not a line written by the curation server ({detail})."
    E973 = "Unknown NIL grouping {value!r}; choose one of {choices}."


class Warnings(metaclass=ErrorsWithCodes):
    W001 = "{count} gold concept ids were not found in the knowledge base and were skipped (e.g. {examples})."
    W002 = "{count} entities longer than {max_chars} characters were truncated before encoding."
    W003 = (
        "{what} stopped by its wall-clock safety stop ({setting} = {minutes:g}) after {steps}{planned}: this model "
        "is not the one its budget of steps trains, and it depends on this machine's speed. Give {setting} a larger "
        "value (0: no safety stop) to train every step."
    )
    # knowledge bases of millions of names
    W106 = (
        "The lexical index is off for {names:,} names (more than {limit:,}): its TF-IDF matrices would take "
        "gigabytes. Candidates come from the dense sieve alone; the lexical features are 0."
    )
    # reliability
    W980 = "composite_splitter: the entity {text!r} could not be split ({error}); it is linked whole."
    W981 = (
        "{path} predates the last save of {parts} (by nlp.to_disk): spaCy's files are not checked. Save the "
        "pipeline with spacy_conceptnorm.save to check every file again."
    )
    # annotate --engine ray
    W990 = "{path} was written with other settings ({changed}): its shards are done again."
    # curation server (serve command)
    W970 = "{path}:{line}: the last record is incomplete (annotate still writing, or killed); it is skipped."
    W971 = "{path}:{line}: the last review is incomplete ({size} bytes, the server was killed mid-write); cut off."
    W972 = "Review {seq} names {what} that is not there any more; skipped."


class ConceptNormError(ValueError):
    """Raised on bad input: a malformed file, a corrupt saved pipeline, a wrong argument."""
