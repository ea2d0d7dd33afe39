"""Training: the name encoder (`train`, `train-bne`), the second-stage ranker (`train-ranker`) and the sieve and NIL
thresholds (`calibrate`), each saved where the pipeline reads it."""

from __future__ import annotations

from pathlib import Path

import typer

from ._util import app


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
