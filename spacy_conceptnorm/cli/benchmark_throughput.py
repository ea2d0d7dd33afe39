"""`benchmark throughput`: the whole pipeline's documents/s, against the least its recognizer's transformer must
compute, and each component's share.

    python -m spacy_conceptnorm benchmark throughput PIPELINE DATA [--passes 3] [--batch-size N] \
        [--n-process 1] [--output figures.json]

DATA is a file of documents, read as `benchmark speed` reads it (a `.spacy` DocBin or a directory of them, a
PubTator file, plain text), of which only the texts are used; a JSONL line needs only a "text" string, so the whole
notes of docs/clinical_notes/whole/*.jsonl (`{"note": ..., "text": ..., "spans": [...]}`) are documents too.

The texts go through the whole pipeline, `list(nlp.pipe(texts))`, with the concept_normalizer's cache off, so that
every pass links its mentions cold, as a corpus of distinct documents does: one untimed pass over the first two
texts (it loads the weights), then `--passes` timed passes. The figure to read them against is the floor: the
forward pass of the recognizer's transformer (a spacy-transformers `TransformerModel`, in a `transformer` pipe or
inside a recognizer that carries its own copy, as `assemble` sources it) over the same texts' word pieces, each
piece once, in windows of the recognizer's `window` (or the model's longest input, if shorter) without overlap,
32 windows a forward pass sorted by length, in the precision the recognizer runs in (bf16 autocast on CPU where its
`cpu_precision` says so). Only those forward passes are timed: the texts are cut into word pieces before. The
pipeline and the floor take turns in each pass, in one process. The recognizer computes more than the floor (its
windows overlap, and a window of `window` words holds more word pieces than words), and all else the pipeline does
is above it.

A last, instrumented pass of the pipeline (one process) times the tokenizer and each pipe's generator: each
component's own share, and spaCy's (`nlp.pipe` outside the pipes).

Medians over the passes; the last line is `ratio X`: the median over the passes of the pipeline's seconds over the
floor's in the same pass (with no transformer in the pipeline, `floor: none`). docs/benchmarks.md has the figures of
the shipped pipelines.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ._util import benchmark_cli
from .benchmark_speed import pipe_split, read_documents

if TYPE_CHECKING:
    from spacy.language import Language
    from thinc.api import Model

FLOOR_BATCH = 32  # windows a forward pass
DEFAULT_WINDOW = 128  # word pieces, where the recognizer's config names no window


def read_texts(nlp: Language, path: Path) -> list[str]:
    """The texts of the documents of `path` (see the module docstring), blank ones left out: a JSONL line's
    "text", whatever else the line holds (a line without one is reported on stderr and skipped), else the texts
    of `read_documents`."""
    from ..annotate import detect_input_format

    if path.is_dir() or path.suffix == ".spacy" or detect_input_format(path) != "jsonl":
        texts = [doc.text for doc in read_documents(nlp, path)]
    else:
        texts = jsonl_texts(path)
    return [text for text in texts if text.strip()]


def jsonl_texts(path: Path) -> list[str]:
    """The "text" string of each line of a JSONL file; a line that is not JSON or has none is reported on stderr
    and skipped."""
    import srsly

    from ..io.files import read_lines

    def report(lineno: int, problem: str) -> None:
        typer.echo(f"{path}:{lineno}: {problem}: skipped", err=True)

    texts = []
    for lineno, line in read_lines(path, on_error=lambda lineno, e: report(lineno, f"not UTF-8 (byte {e.start})")):
        if line is None or not line.strip():
            continue
        try:
            record = srsly.json_loads(line)
        except ValueError as e:
            report(lineno, f"invalid JSON ({e})")
            continue
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            texts.append(record["text"])
        else:
            report(lineno, "no 'text' string")
    return texts


def transformer_settings(config: dict) -> dict | None:
    """The block of a component's config that builds its transformer: the first, depth first, with `get_spans`."""
    if "get_spans" in config:
        return config
    for value in config.values():
        if isinstance(value, dict) and (found := transformer_settings(value)) is not None:
            return found
    return None


def find_transformers(nlp: Language) -> list[tuple[str, Model, dict]]:
    """The spacy-transformers `TransformerModel` layers of the pipeline that hold their Hugging Face model, with the
    component that holds each and the config block that builds it: a `transformer` pipe's, or a recognizer's own
    copy."""
    try:
        from spacy_transformers.layers import TransformerModel
    except ImportError:
        return []
    from thinc.api import Model

    found, seen = [], set()
    for name, proc in nlp.pipeline:
        model = getattr(proc, "model", None)
        if not isinstance(model, Model):
            continue
        for node in model.walk():
            if isinstance(node, TransformerModel) and node.transformer is not None and node.id not in seen:
                seen.add(node.id)
                found.append((name, node, transformer_settings(dict(nlp.get_pipe_config(name))) or {}))
    return found


class TransformerFloor:
    """The forward passes of a pipeline's transformers over the word pieces of a set of texts, each piece once
    (see the module docstring): the texts are cut into windows when it is made, `run` times the forward passes.

    transformers (list[tuple[str, Model, dict]]): `find_transformers`'s.
    texts (list[str]): The texts.
    batch (int): Windows a forward pass.
    """

    def __init__(self, transformers: list[tuple[str, Model, dict]], texts: list[str], batch: int = FLOOR_BATCH):
        import torch

        from ..ml.recognizer import runs_in_bf16

        self.components = [name for name, _, _ in transformers]
        self.parts: list[tuple[Any, list[dict], str]] = []  # (the torch model, its batches, its precision)
        self.windows = self.word_pieces = 0
        self.window = DEFAULT_WINDOW
        for _, layer, settings in transformers:
            tokenizer, model = layer.tokenizer, layer.transformer
            get_spans = settings.get("predict_spans") or settings.get("get_spans")  # the windows at inference
            window = get_spans.get("window", DEFAULT_WINDOW) if isinstance(get_spans, dict) else DEFAULT_WINDOW
            longest = getattr(model.config, "max_position_embeddings", None) or window
            self.window = width = min(int(window), int(longest), int(tokenizer.model_max_length))
            own = str(settings.get("@architectures", "")).startswith("spacy_conceptnorm.")
            bf16 = own and runs_in_bf16(settings.get("cpu_precision", "auto"))
            device = next(model.parameters()).device
            precision = "bf16" if bf16 and device.type == "cpu" else "fp32"
            windows = []
            for text in texts:
                pieces = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
                self.word_pieces += len(pieces)
                for start in range(0, len(pieces), width - 2):
                    windows.append(tokenizer.build_inputs_with_special_tokens(pieces[start : start + width - 2]))
            windows.sort(key=len)
            self.windows += len(windows)
            pad = tokenizer.pad_token_id or 0
            batches = []
            for start in range(0, len(windows), batch):
                chunk = windows[start : start + batch]
                longest_in = max(map(len, chunk))
                ids = torch.full((len(chunk), longest_in), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), longest_in), dtype=torch.long)
                for row, window_ids in enumerate(chunk):
                    ids[row, : len(window_ids)] = torch.tensor(window_ids)
                    mask[row, : len(window_ids)] = 1
                batches.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
            self.parts.append((model, batches, precision))

    @property
    def precisions(self) -> list[str]:
        """The precision of each transformer's forward passes: "bf16" (autocast on CPU) or "fp32"."""
        return [precision for _, _, precision in self.parts]

    def run(self, batches: int | None = None) -> float:
        """Seconds of the forward passes over every window (`batches`: over the first so many batches only).

        batches (Optional[int]): The batches of each transformer to run; None: all.
        """
        import torch

        seconds = 0.0
        for model, inputs, precision in self.parts:
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
            training = model.training
            model.eval()  # as thinc's predict runs it: no dropout
            try:
                with torch.inference_mode(), autocast:
                    start = time.perf_counter()
                    for batch in inputs[:batches]:
                        model(**batch)
                    if torch.cuda.is_available() and inputs and inputs[0]["input_ids"].is_cuda:
                        torch.cuda.synchronize()
                    seconds += time.perf_counter() - start
            finally:
                model.train(training)
        return seconds


@benchmark_cli.command("throughput")
def benchmark_throughput(
    pipeline: str = typer.Argument(..., help="Pipeline directory or package"),
    data: Path = typer.Argument(..., help="Documents: .spacy, PubTator, JSONL or plain text", exists=True),
    passes: int = typer.Option(3, min=1, help="Timed passes of the pipeline and of the floor, taking turns"),
    batch_size: int = typer.Option(None, min=1, help="nlp.pipe's batch size (default: the pipeline's)"),
    n_process: int = typer.Option(1, min=1, help="nlp.pipe's processes (the floor runs in one)"),
    output: Path = typer.Option(None, help="Write the figures as JSON here"),
) -> None:
    """The whole pipeline's documents/s against its transformer's forward passes, and each component's share.

    The last line is `ratio X`: the pipeline's seconds over the floor's, the forward passes of the recognizer's
    transformer over the same word pieces (docs/benchmarks.md).
    """
    from ..errors import ConceptNormError
    from ..io.files import write_json
    from ..io.pipelines import load
    from ..ml.threads import install_thread_settings, workers_die_with_parent
    from .benchmark_weight import machine

    try:
        nlp = load(pipeline)
        texts = read_texts(nlp, data)
    except (ConceptNormError, OSError) as e:  # OSError: spaCy's E050, no pipeline there
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(1) from None
    if not texts:
        typer.echo(f"Error: no documents in {data} (no text in any record).", err=True)
        raise typer.Exit(1)
    normalizers = [proc for name, proc in nlp.pipeline if nlp.get_pipe_meta(name).factory == "concept_normalizer"]
    for normalizer in normalizers:
        normalizer.cache_size = 0
    transformers = find_transformers(nlp)
    floor = TransformerFloor(transformers, texts) if transformers else None
    characters = sum(map(len, texts))
    figures: dict = {
        "machine": machine(),
        "pipeline": str(pipeline),
        "data": str(data),
        "docs": len(texts),
        "characters": characters,
        "pipes": nlp.pipe_names,
        "batch_size": batch_size or nlp.batch_size,
        "n_process": n_process,
        "passes": [],
    }
    if n_process > 1:
        install_thread_settings()  # forked workers: one torch thread each (a thread pool of the parent's hangs)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # else each forked worker warns
    list(nlp.pipe(texts[:2], batch_size=batch_size))  # untimed: loads the weights
    if floor:
        floor.run(batches=1)  # untimed: the first forward pass prepares its kernels
    with workers_die_with_parent() if n_process > 1 else nullcontext():
        for _ in range(passes):
            run = {"load_before": os.getloadavg()[0]}
            start = time.perf_counter()
            list(nlp.pipe(texts, batch_size=batch_size, n_process=n_process))
            run["pipeline_seconds"] = time.perf_counter() - start
            if floor:
                run["floor_seconds"] = floor.run()
            figures["passes"].append(run)
    start = time.perf_counter()
    docs = [nlp.make_doc(text) for text in texts]
    split = {"tokenizer": time.perf_counter() - start, **pipe_split(nlp, docs, batch_size)}
    figures["load_average_after"] = os.getloadavg()[0]
    seconds = statistics.median(run["pipeline_seconds"] for run in figures["passes"])
    figures.update(
        pipeline_seconds=seconds,
        docs_per_second=len(texts) / seconds,
        characters_per_second=characters / seconds,
        split_seconds=split,
        split_total_seconds=sum(split.values()),
    )
    if floor:
        floor_seconds = statistics.median(run["floor_seconds"] for run in figures["passes"])
        figures["floor"] = {
            "components": floor.components,
            "precisions": floor.precisions,
            "window": floor.window,
            "windows": floor.windows,
            "word_pieces": floor.word_pieces,
            "seconds": floor_seconds,
            "docs_per_second": len(texts) / floor_seconds,
        }
        # each pass's own ratio (the pipeline and the floor run one after the other), so that a machine whose speed
        # drifts over the passes still gives the ratio of one moment
        figures["ratio"] = statistics.median(
            run["pipeline_seconds"] / run["floor_seconds"] for run in figures["passes"]
        )
    else:
        figures["floor"] = None

    typer.echo(
        f"{pipeline}: {len(texts)} docs, {characters:,} characters; {passes} pass{'es' if passes > 1 else ''}, "
        f"batch size {figures['batch_size']}, {n_process} process{'es' if n_process > 1 else ''}; {figures['machine']}"
    )
    loads = [run["load_before"] for run in figures["passes"]] + [figures["load_average_after"]]
    typer.echo(f"load average during the passes: {min(loads):.2f}-{max(loads):.2f}")
    typer.echo(
        f"\npipeline ({' -> '.join(nlp.pipe_names)}{', cache off' if normalizers else ''}): "
        f"{figures['docs_per_second']:.1f} docs/s, "
        f"{figures['characters_per_second']:,.0f} chars/s ({seconds:.3f} s a pass, median)"
    )
    total = figures["split_total_seconds"]
    typer.echo(f"\neach component's share of one instrumented pass ({total:.3f} s, one process)")
    typer.echo("| component | seconds | share |")
    typer.echo("|---|---|---|")
    for part, value in split.items():
        typer.echo(f"| {part} | {value:.3f} | {100 * value / total:.0f}% |")
    if output:
        write_json(output, figures)
    if not floor:
        typer.echo("\nfloor: none (the pipeline has no transformer)")
        return
    found = figures["floor"]
    typer.echo(
        f"\nfloor: forward passes of the transformer in {', '.join(found['components'])} "
        f"({'/'.join(found['precisions'])}; {found['word_pieces']:,} word pieces in {found['windows']:,} windows "
        f"of up to {found['window']}): {found['seconds']:.3f} s, {found['docs_per_second']:.1f} docs/s"
    )
    typer.echo(f"ratio {figures['ratio']:.2f}")
