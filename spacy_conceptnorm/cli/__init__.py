"""Command line: `python -m spacy_conceptnorm <command>` (also installed as `spacy-conceptnorm`)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Link biomedical entities to ontology concepts.")


@app.callback()
def _commands() -> None:
    """Link biomedical entities to ontology concepts."""


@app.command("build-kb")
def build_kb(
    source: Path = typer.Argument(..., help="Ontology file: CTD TSV, MEDIC/ID||name, JSONL, OBO or MRCONSO.RRF"),
    output: Path = typer.Argument(..., help="Where to write the knowledge base (.kb)"),
    format: str = typer.Option("auto", help="auto, ctd, medic, id_name, jsonl, obo, mrconso"),
) -> None:
    """Build a knowledge base from an ontology file and save it."""
    from ..kb.knowledge_base import load_kb

    kb = load_kb(source, format=format)
    kb.to_disk(output)
    typer.echo(f"{len(kb)} concepts, {len(kb.names())} names -> {output}")


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="Training config, e.g. configs/train_xu_bethard.cfg"),
    output: Path = typer.Option(..., "--output", "-o", help="Output directory (model-best/, model-last/, ...)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUTPUT/checkpoint"),
) -> None:
    """Train the name encoder. Override config values as `spacy train` does: --training.batch_size 128."""
    from spacy.cli._util import parse_config_overrides

    from ..training.trainer import train as run_training

    run_training(config, output, parse_config_overrides(ctx.args), resume=resume)


@app.command("train-bne")
def train_bne(
    kb: Path = typer.Argument(..., help="Ontology file (load_kb formats) or saved .kb whose synonym sets train BNE"),
    output: Path = typer.Argument(..., help="Encoder directory to write (replaced whole once trained)"),
    config: Path = typer.Option(None, "--config", help="Recipe with the settings, e.g. configs/bne.cfg"),
    vectors: Path = typer.Option(None, "--vectors", help="word2vec text-format word vectors (default: train them)"),
    text: list[Path] = typer.Option([], "--text", help="PubTator file(s) whose text trains the word vectors"),
    ctd: Path = typer.Option(None, "--ctd", help="CTD diseases TSV whose definitions join the word-vector text"),
    dev: Path = typer.Option(None, "--dev", help="PubTator file: keep the epoch with the best nearest-name Acc@1"),
    epochs: int = typer.Option(None, "--epochs", help="Passes over the name-concept pairs (the config's, else 3)"),
    pairs_per_epoch: int = typer.Option(None, "--pairs-per-epoch", help="Anchor names per epoch (0: all; default 0)"),
    holdout: int = typer.Option(None, "--holdout", help="Concepts held out for the closeness scores (default 1000)"),
    seed: int = typer.Option(None, "--seed", help="Seed of the held-out split, batches, initialization (default 0)"),
    threads: int = typer.Option(None, "--threads", help="torch threads (0: torch's default; default 1)"),
    save_vectors: Path = typer.Option(None, "--save-vectors", help="Also write the trained word vectors here"),
) -> None:
    """Train the BNE name encoder (Phan et al. 2019) on a dictionary's synonym sets; load it with
    spacy_conceptnorm.ml.bne.BNEEncoder.load(OUTPUT) or @misc = "spacy_conceptnorm.bne_encoder.v1". The settings come
    from --config (its sections training, network and vectors; defaults for what it leaves out); the options
    given here override it."""
    import torch

    from ..training.bne import train_from_files
    from ..training.bne_settings import read_recipe

    given = {"epochs": epochs, "pairs_per_epoch": pairs_per_epoch, "holdout": holdout, "seed": seed,
             "threads": threads}  # fmt: skip
    recipe = read_recipe(config, {f"training.{k}": v for k, v in given.items() if v is not None})
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    report = train_from_files(
        kb, output, recipe.train, vectors, text, ctd, dev, save_vectors, log=typer.echo, word2vec=recipe.word2vec
    )
    typer.echo(f"trained in {report['train_seconds']} s -> {output}")


@app.command("preprocess")
def preprocess(
    sources: list[Path] = typer.Argument(
        ..., help="PubTator file(s) (NCBI-disease, BC5CDR); several are concatenated", exists=True, dir_okay=False
    ),
    output: Path = typer.Argument(..., help="Where to write the DocBin (.spacy)"),
    label: str = typer.Option("Disease", help="Entity label of every mention ('' keeps the mention type)"),
    lang: str = typer.Option("en", help="Language whose tokenizer splits the text"),
) -> None:
    """Convert a PubTator corpus to a .spacy DocBin: gold entities with the concept ids as kb_id_, the PMID in
    user_data. The file is written atomically."""
    import spacy
    from spacy.tokens import DocBin

    from ..errors import ConceptNormError, Errors
    from ..io.corpus import pubtator_to_docs
    from ..io.files import atomic_open

    nlp, doc_bin, n_ents = spacy.blank(lang), DocBin(store_user_data=True), 0
    for source in sources:
        n_docs = len(doc_bin)
        for doc in pubtator_to_docs(nlp, source, label=label or None):
            doc_bin.add(doc)
            n_ents += len(doc.ents)
        if len(doc_bin) == n_docs:
            raise ConceptNormError(Errors.E603.format(path=source))
    with atomic_open(output) as f:
        f.write(doc_bin.to_bytes())
    typer.echo(f"{len(doc_bin)} documents, {n_ents} entities -> {output}")


@app.command("annotate")
def annotate(
    model: str = typer.Argument(..., help="Saved pipeline directory (spacy.load), e.g. ner + concept_normalizer"),
    input: Path = typer.Argument(..., help="A .jsonl, PubTator or .txt file, or a directory of .txt files"),
    output: Path = typer.Argument(..., help="The .jsonl or .pubtator file to write; an existing one is resumed"),
    n_process: int = typer.Option(1, "--n-process", help="Processes for nlp.pipe"),
    batch_size: int = typer.Option(64, "--batch-size", help="Documents per batch (and per flushed write)"),
    input_format: str = typer.Option("auto", "--input-format", help="auto, jsonl, pubtator or txt"),
    output_format: str = typer.Option("auto", "--output-format", help="auto, jsonl or pubtator"),
    strict: bool = typer.Option(False, "--strict", help="Fail on a malformed input record instead of skipping it"),
    include_text: bool = typer.Option(False, "--include-text", help="Write each document's text to the JSONL"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar and no summary line"),
    engine: str = typer.Option("local", "--engine", help="local (nlp.pipe here) or ray (Ray Data actors)"),
    address: str = typer.Option(None, "--address", help="ray: the cluster to join (default RAY_ADDRESS, else local)"),
    concurrency: int = typer.Option(None, "--concurrency", help="ray: actors, one pipeline each (default: CPUs)"),
    num_gpus: float = typer.Option(0.0, "--num-gpus", help="ray: GPUs per actor (a fraction shares a GPU)"),
    shard_size: int = typer.Option(1000, "--shard-size", help="ray: documents per shard, the unit of resuming"),
) -> None:
    """Link the entities of every document of INPUT and append them to OUTPUT, skipping ids already there."""
    from ..annotate import annotate as run_annotate
    from ..annotate import annotate_ray, parts_dir
    from ..errors import ConceptNormError, Errors

    common = dict(batch_size=batch_size, input_format=input_format, output_format=output_format, strict=strict,
                  include_text=include_text, progress=not quiet)  # fmt: skip
    ray_options = {"--address": address, "--concurrency": concurrency, "--num-gpus": num_gpus or None,
                   "--shard-size": None if shard_size == 1000 else shard_size}  # fmt: skip
    try:
        if engine not in ("local", "ray"):
            raise ConceptNormError(Errors.E997.format(engine=engine))
        misplaced = [name for name, value in ray_options.items() if value is not None] if engine == "local" else []
        misplaced += ["--n-process"] if engine == "ray" and n_process != 1 else []
        if misplaced:
            raise ConceptNormError(Errors.E996.format(options=", ".join(misplaced), engine=engine))
        if engine == "ray":
            summary = annotate_ray(
                model, input, output, address=address, concurrency=concurrency, num_gpus=num_gpus,
                shard_size=shard_size, **common,
            )  # fmt: skip
        else:
            summary = run_annotate(model, input, output, n_process=n_process, **common)
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        kept = (
            f"{parts_dir(output)} holds every finished shard"
            if engine == "ray"
            else f"{output} holds every completed document"
        )
        typer.echo(f"Interrupted: {kept}; run again to resume.", err=True)
        raise typer.Exit(130) from None
    if not quiet:
        typer.echo(f"{summary} -> {output}")


@app.command("evaluate")
def evaluate(
    model: Path = typer.Argument(..., help="Saved pipeline directory (ner optional, concept_normalizer)"),
    test: Path = typer.Option(..., "--test", help="Gold test data: .spacy DocBin or PubTator file"),
    train: Path = typer.Option(..., "--train", help="Gold train data: its mentions define the refined test set"),
    dev: Path = typer.Option(None, "--dev", help="Gold dev data for the NIL calibration (omit to skip NIL)"),
    output: Path = typer.Option(Path("metrics"), "--output", "-o", help="Directory for the JSON, PNG and report.md"),
    strategies: bool = typer.Option(True, "--strategies/--no-strategies", help="Also score all 14 search strategies"),
    holdout: float = typer.Option(0.2, help="Part of the mentions whose concepts are held out for NIL"),
    seed: int = typer.Option(0, help="Seed of the NIL hold-out"),
    hold_outs: int = typer.Option(8, "--hold-outs", min=1, help="Test NIL hold-outs also averaged (seeds SEED on)"),
) -> None:
    """Evaluate a pipeline: gold-mention Acc@1/Acc@5, end-to-end P/R/F1, NIL thresholds; write metrics/."""
    from ..evaluation.calibrate import load_pipeline
    from ..evaluation.gold import read_gold_docs
    from ..evaluation.linking import evaluate_pipeline
    from ..evaluation.report import write_report

    nlp = load_pipeline(model)
    test_docs, train_docs = read_gold_docs(nlp, test), read_gold_docs(nlp, train)
    dev_docs = read_gold_docs(nlp, dev) if dev is not None else None
    metrics = evaluate_pipeline(
        nlp, test_docs, train_docs, dev_docs, strategies=strategies, holdout=holdout, seed=seed, hold_outs=hold_outs
    )
    report = write_report(metrics, output)
    typer.echo(report.read_text().split("\n![")[0])
    typer.echo(f"-> {report}")


@app.command("evaluate-assertion")
def evaluate_assertion(
    model: str = typer.Argument(..., help="Pipeline directory or package (clinical_context is added if it has none)"),
    data: Path = typer.Argument(..., help='JSONL, a span a line: {"text", "start", "end", "status"[, "id"]}'),
    output: Path = typer.Option(None, "--output", help="Also write the report here (JSON)"),
    clinical_recall: bool = typer.Option(False, help="Turn on the settings for clinical notes (docs/clinical.md)"),
) -> None:
    """Assertion status on your annotated clinical text: per status precision/recall (on the annotated spans), and
    how many of the spans the pipeline recognized and linked."""
    from ..errors import ConceptNormError
    from ..evaluation.assertion import evaluate_assertions, read_annotated_spans
    from ..io.files import write_json
    from ..io.pipelines import load
    from ..pipeline.clinical_settings import use_clinical_settings

    try:
        nlp = load(model)
        if clinical_recall:
            use_clinical_settings(nlp)
        report = evaluate_assertions(nlp, read_annotated_spans(data))
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{report['spans']} spans in {report['texts']} texts: accuracy {100 * report['accuracy']:.2f}")
    for status, r in report["statuses"].items():
        typer.echo(f"  {status:<12} n={r['support']:<5} P {100 * r['precision']:6.2f}  R {100 * r['recall']:6.2f}")
    rec, n = report["recognition"], report["spans"]
    found = f"recognized {rec['recognized']} of {n} ({100 * rec['recognized'] / n:.1f}%, {rec['exact']} exact)"
    typer.echo(f"{found}, linked {rec['linked']}")
    if m := rec["with_concept_id"]:
        found = f"recognized {rec['recognized_with_concept_id']} ({100 * rec['recognized_with_concept_id'] / m:.1f}%)"
        typer.echo(f"of the {m} spans with a concept id: {found}, linked right {rec['linked_right']} "
                   f"({100 * rec['linked_right'] / m:.1f}%)")  # fmt: skip
    if output:
        write_json(output, report)
        typer.echo(f"-> {output}")


@app.command("calibrate")
def calibrate(
    model: Path = typer.Argument(..., help="Saved pipeline directory"),
    dev: Path = typer.Option(..., "--dev", help="Gold dev data: .spacy DocBin or PubTator file"),
    train: Path = typer.Option(None, "--train", help="Gold train data: dev mentions also in it stay domain names"),
    strategy: str = typer.Option(
        "in_kb_budget",
        help="NIL threshold strategy: in_kb_budget (at most half a point of in-KB accuracy lost), "
        "weighted, first_fp or last_tp",
    ),
    tune_sieve: bool = typer.Option(True, help="Also choose the sieve threshold on dev"),
    holdout: float = typer.Option(0.2, help="Part of the dev mentions whose concepts are held out"),
    seed: int = typer.Option(0, help="Seed of the hold-out"),
    to: Path = typer.Option(None, "--to", help="Save the calibrated pipeline here (default: rewrite MODEL)"),
    output: Path = typer.Option(None, "--output", "-o", help="Also write the calibration figures here (JSON)"),
) -> None:
    """Choose the sieve threshold and the NIL threshold (DILBERT's strategies) on dev; save them into the pipeline."""
    from ..evaluation.calibrate import calibrate as run_calibration
    from ..io.files import write_json

    figures = run_calibration(
        model, dev, strategy, holdout, seed, train=train, tune_sieve=tune_sieve, output_model=to
    )  # fmt: skip
    typer.echo(f"dev mentions taken out of the domain names while calibrating: {figures['hidden_dev_names']}")
    if figures["sieve"]:
        accs = "  ".join(f"{t}: {100 * a:.2f}" for t, a in figures["sieve"]["dev_acc1"].items())
        typer.echo(f"sieve threshold, dev Acc@1 -> {accs}; chosen {figures['sieve']['threshold']}")
    for name, value in figures["thresholds"].items():
        acc = figures["dev"][name]
        typer.echo(
            f"{name:>8}: threshold {value:.4f}  dev in-KB {100 * acc['in_kb_acc']:.2f}  "
            f"out-of-KB {100 * acc['out_of_kb_acc']:.2f}  overall {100 * acc['overall_acc']:.2f}"
        )
    if output is not None:
        write_json(output, figures)
    typer.echo(f"nil_threshold = {figures['nil_threshold']:.4f} ({strategy}) -> {to or model}")


@app.command("train-ranker")
def train_ranker(
    model: Path = typer.Argument(..., help="Saved pipeline directory (from assemble)"),
    train: Path = typer.Option(..., "--train", help="Gold train data: .spacy DocBin or PubTator file"),
    dev: Path = typer.Option(None, "--dev", help="Gold dev data for the report (and the pair scorers' epochs)"),
    to: Path = typer.Option(None, "--to", help="Save the pipeline with its trained ranker here (default: MODEL)"),
    folds: int = typer.Option(5, help="Folds of the train documents (each linked without its own mentions)"),
    seed: int = typer.Option(0, help="Seed of the folds and of the pair scorers"),
    alpha: float = typer.Option(
        0.05, min=0.0, max=1.0, help="Level of the dev sign test the ranker must pass to reorder (1.0: any net win)"
    ),
    output: Path = typer.Option(None, "--output", "-o", help="Also write the training report here (JSON)"),
) -> None:
    """Train the concept_normalizer's second-stage ranker on the train mentions and save it into the pipeline."""
    from ..evaluation.calibrate import load_pipeline
    from ..evaluation.gold import read_gold_docs
    from ..io.files import write_json
    from ..io.pipelines import save
    from ..training.ranking import train_ranker as run

    nlp = load_pipeline(model)
    dev_docs = read_gold_docs(nlp, dev) if dev else []
    report = run(nlp, read_gold_docs(nlp, train), dev_docs, folds, seed, typer.echo, alpha)
    save(nlp, to or model)
    if output is not None:
        write_json(output, report)
    for split in ("train", "dev"):
        if report.get(split, {}).get("examples"):
            r = report[split]
            typer.echo(
                f"{split}: {r['examples']} mentions, candidate recall {100 * r['recall_all']:.2f} "
                f"(sieve top-k {100 * r[next(k for k in r if k.endswith('_dense'))]:.2f}), "
                f"Acc@1 sieve {100 * r['sieve_acc1']:.2f} -> ranker {100 * r['ranker_acc1']:.2f}"
            )
    typer.echo(f"-> {to or model}")


@app.command("assemble", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def assemble(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="Pipeline config, e.g. configs/pipeline.cfg", exists=True, dir_okay=False),
    output: Path = typer.Argument(..., help="Pipeline directory to write; an existing one is replaced whole"),
    clinical: bool = typer.Option(
        None,
        "--clinical/--no-clinical",
        help="A pipeline for clinical notes: clinical_context and the settings of docs/clinical.md (default: "
        "clinical_context alone, where medspaCy is installed)",
    ),
) -> None:
    """Assemble a pipeline from a config as `spacy assemble` does (sourced components, the initialize section),
    but write it beside OUTPUT and swap it in only once saved: a failed run leaves the previous pipeline intact.
    Override config values as `spacy assemble` does: --paths.ner training/ner/model-best. The assertion status
    (clinical_context, after linking) is added where the `assertion` extra and medspaCy are installed; --clinical
    also turns on the settings for clinical notes."""
    from spacy.cli._util import parse_config_overrides, show_validation_error
    from spacy.util import get_sourced_components, load_config, load_model_from_config

    from ..io.pipelines import save
    from ..pipeline.clinical_context import add_clinical_context
    from ..pipeline.clinical_settings import add_clinical_abbreviations, clinical_overrides

    with show_validation_error(config, hint_fill=False):
        overrides = parse_config_overrides(ctx.args)
        cfg = load_config(config, overrides=overrides, interpolate=False)
        if clinical:
            cfg = load_config(
                config, overrides={**overrides, **clinical_overrides(cfg["components"])}, interpolate=False
            )
        nlp = load_model_from_config(cfg, auto_fill=True)
    if clinical:
        add_clinical_abbreviations(nlp)
    if clinical is not False:
        add_clinical_context(nlp, required=bool(clinical))
    nlp._link_components()  # as spacy assemble: listeners are linked before initializing
    with nlp.select_pipes(disable=[*get_sourced_components(cfg.interpolate())]):
        nlp.initialize()
    save(nlp, output)
    typer.echo(f"{' -> '.join(nlp.pipe_names)} -> {output}")


@app.command("clinical")
def clinical(
    model: str = typer.Argument(..., help="Pipeline directory or package, e.g. training/pipeline"),
    output: Path = typer.Argument(..., help="Pipeline directory to write; an existing one is replaced whole"),
) -> None:
    """Save a copy of a pipeline for clinical notes: clinical_abbreviations and the settings for clinical notes
    (docs/clinical.md), and clinical_context last where medspaCy is installed."""
    from ..errors import ConceptNormError
    from ..io.pipelines import load, save
    from ..pipeline.clinical_context import add_clinical_context
    from ..pipeline.clinical_settings import use_clinical_settings

    try:
        nlp = load(model)
        use_clinical_settings(nlp)
        has_context = add_clinical_context(nlp)
        save(nlp, output)
    except (ConceptNormError, OSError) as e:  # OSError: spaCy's E050, no pipeline there
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    missing = "" if has_context else " (no clinical_context: medspaCy is not installed)"
    typer.echo(f"{' -> '.join(nlp.pipe_names)} -> {output}{missing}")


@app.command("cluster")
def cluster(
    terms: Path = typer.Argument(..., help="A term list (one a line), a KB file (load_kb formats) or annotate JSONL"),
    output: Path = typer.Argument(..., help="JSONL to write (atomically): one cluster a line, the largest first"),
    model: str = typer.Option(None, "--model", help="Encoder: transformers directory or id (default: packaged MiniLM)"),
    top_m: int = typer.Option(50, "--top-m", help="Neighbours searched per term"),
    threshold: float = typer.Option(0.88, "--threshold", help="Cosine at or above which a neighbour pair is clustered"),
    sweep: bool = typer.Option(False, "--sweep", help="Also write OUTPUT.sweep.json (and .sweep.png with gold)"),
    input_format: str = typer.Option("auto", "--input-format", help="auto, terms, kb or annotate (its NIL mentions)"),
    ambiguous: str = typer.Option("drop", help="KB names of several concepts: drop, or first (the first concept)"),
    index: str = typer.Option("auto", help="auto (exact; IVF beyond 200k terms), exact, flat, hnsw or ivf"),
) -> None:
    """Cluster terms (CODER++): top-m neighbours by cosine, pairs >= threshold, connected components. A KB gives
    gold clusters (its concept ids) and pairwise P/R/F1; an annotate output's NIL mentions become proposed concepts."""
    from ..clustering import cluster_file, load_encoder
    from ..errors import ConceptNormError

    try:
        summary = cluster_file(
            terms, output, load_encoder(model), top_m, threshold, sweep, input_format, ambiguous, index, progress=True
        )
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{summary['terms']} terms -> {summary['clusters']} clusters ({summary['predicted_pairs']} pairs >= "
               f"{threshold}, {summary['index']} search, {summary['seconds']} s) -> {output}")  # fmt: skip
    for reading in ("pairs", "clusters_eval"):
        if reading in summary:
            s = summary[reading]
            typer.echo(f"{reading}: P {s['precision']:.3f}  R {s['recall']:.3f}  F1 {s['f1']:.3f}")
    for key in ("sweep", "plot"):
        if key in summary:
            typer.echo(f"{key} -> {summary[key]}")


@app.command("serve")
def serve(
    model: str = typer.Argument(..., help="The pipeline that annotated (a directory or package for spacy.load)"),
    annotations: Path = typer.Option(..., "--annotations", help="The JSONL output of annotate (--include-text)"),
    reviews: Path = typer.Option(None, "--reviews", help="Reviews log to append to (default OUT.reviews.jsonl)"),
    synonyms: Path = typer.Option(None, "--synonyms", help="Synonyms file to rewrite (default OUT.synonyms.jsonl)"),
    documents: Path = typer.Option(None, "--documents", help="The annotate input, for texts OUT does not hold"),
    save_model: Path = typer.Option(None, "--save-model", help="Directory 'Save pipeline' writes (with synonyms)"),
    nil_clusters: str = typer.Option("coder", "--nil-clusters", help="NIL grouping: coder (CODER++) or text"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; other than loopback needs --token"),
    port: int = typer.Option(8000, "--port", help="Port"),
    token: str = typer.Option(None, "--token", envvar="CONCEPTNORM_TOKEN", help="Required on every API request"),
) -> None:
    """The curation page: review the links of an annotate output worst first, correct them, add synonyms."""
    from ..errors import ConceptNormError
    from ..serve import load_curation, run_server
    from ..serve.app import check_bind

    try:
        check_bind(host, token)
        curation = load_curation(model, annotations, reviews, synonyms, documents, save_model, nil_clusters)
    except ConceptNormError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    info = curation.info()
    typer.echo(f"{info['mentions']} mentions of {info['documents']} documents; reviews -> {info['reviews']}")
    typer.echo(f"http://{host}:{port}/" + ("#token=TOKEN (your --token)" if token else ""))
    run_server(curation, host, port, token)


def main() -> None:
    app()
