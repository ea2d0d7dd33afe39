"""The evaluation report: `metrics/evaluation.json` (every figure), `metrics/headline.json` (the headline numbers
as printed), `metrics/evaluation.png` (Acc@1 per search strategy; scores of right and wrong links) and
`metrics/report.md`. Every file is written beside its target and renamed into place.
"""

from __future__ import annotations

from pathlib import Path

from wasabi import MarkdownRenderer

from ..io.files import atomic_open, write_json
from .boundaries import CATEGORIES as BOUNDARY_CATEGORIES

PNG = "evaluation.png"


def headline(metrics: dict) -> dict[str, float | None]:
    """The headline numbers, in report order: accuracies and P/R/F1 in percent (2 decimals), NIL thresholds as
    confidences (4 decimals); None where a part was not evaluated."""
    gold, e2e, nil = metrics["gold_mentions"], metrics.get("end_to_end"), metrics.get("nil")
    rows: dict[str, float | None] = {
        "Acc@1 as shipped (ent.kb_id_, NIL on), gold mentions": _pct(gold["shipped_acc1"]),
        "Acc@1 as shipped, refined gold mentions": _pct(gold["shipped_refined_acc1"]),
        "Acc@1, gold mentions": _pct(gold["acc1"]),
        "Acc@5, gold mentions": _pct(gold["acc5"]),
        "Acc@1, refined gold mentions": _pct(gold["refined_acc1"]),
        "Acc@5, refined gold mentions": _pct(gold["refined_acc5"]),
    }
    if metrics.get("confidence"):
        rows["Expected calibration error of kb_confidence (%)"] = _pct(metrics["confidence"]["ece"])
    for key, label in (("ner", "NER"), ("ner_linking", "NER+linking")):
        for metric, name in (("p", "precision"), ("r", "recall"), ("f", "F1")):
            rows[f"{label} {name}, end to end"] = _pct(e2e[key][metric]) if e2e else None
    if nil:
        split = "test" if "test" in nil else "dev"
        for strategy, threshold in nil["thresholds"].items():
            acc = nil[split][strategy]
            rows[f"NIL threshold, {strategy}"] = round(threshold, 4)
            rows[f"NIL in-KB accuracy, {strategy} ({split}; {_pct(acc['in_kb_acc_no_nil'])} with NIL off)"] = _pct(
                acc["in_kb_acc"]
            )
            rows[f"NIL out-of-KB accuracy, {strategy} ({split})"] = _pct(acc["out_of_kb_acc"])
            rows[f"NIL overall accuracy, {strategy} ({split})"] = _pct(acc["overall_acc"])
        mean = nil.get("test_mean", {}).get("in_kb_budget")  # the shipped operating point, on many hold-outs
        if mean:
            of = f"test, mean of {nil['test_hold_outs']} hold-outs"
            rows[f"NIL in-KB accuracy, in_kb_budget ({of}; {_pct(mean['in_kb_acc_no_nil'])} with NIL off)"] = _pct(
                mean["in_kb_acc"]
            )
            rows[f"NIL out-of-KB accuracy, in_kb_budget ({of})"] = _pct(mean["out_of_kb_acc"])
    return rows


def write_report(metrics: dict, output: str | Path) -> Path:
    """Write the JSON files, the plot and `report.md` into `output`; return the report's path."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    rows = headline(metrics)
    write_json(output / "evaluation.json", metrics)
    write_json(output / "headline.json", rows)
    with atomic_open(output / PNG, "wb") as f:
        plot(metrics).savefig(f, format="png", dpi=100)
    with atomic_open(output / "report.md", "w") as f:
        f.write(markdown(metrics, rows))
    return output / "report.md"


def markdown(metrics: dict, rows: dict[str, float | None]) -> str:
    """`report.md`: the headline table, the plot, and the calibration, strategy and NIL tables present."""
    gold, pipe = metrics["gold_mentions"], metrics["pipeline"]
    md = MarkdownRenderer()
    md.add(md.title(1, "Evaluation report"))
    md.add(
        f"Sieve `{pipe['strategy']}`, `nil_threshold` {pipe['nil_threshold']:.4f}; {gold['mentions']} gold test "
        f"mentions, {gold['refined_mentions']} in the refined set (text not among the train mentions)."
    )
    md.add(md.title(2, "Headline"))
    headline_rows = [(name, _fmt(value, 4 if name.startswith("NIL threshold") else 2)) for name, value in rows.items()]
    md.add(md.table(headline_rows, ["metric", "value"]))
    md.add(f"![Acc@1 per search strategy; confidence of right and wrong links; reliability of kb_confidence]({PNG})")
    conf = metrics.get("confidence")
    if conf:
        md.add(md.title(2, "Calibration of `kb_confidence` (test gold mentions)"))
        ece = f"{100 * conf['ece']:.2f}%"
        md.add(f"Expected calibration error {ece} (10 equal-width bins; right = top candidate right).")
        bins = [
            (f"{b['low']:.1f}-{b['high']:.1f}", str(b["count"]), f"{b['confidence']:.3f}", f"{b['accuracy']:.3f}")
            for b in conf["reliability"]
        ]
        md.add(md.table(bins, ["confidence bin", "links", "mean confidence", "accuracy"]))
    if metrics.get("strategies"):
        md.add(md.title(2, "Search strategies (gold mentions)"))
        keys = ("acc1", "acc5", "refined_acc1", "refined_acc5")
        strategies = [(s, *(_fmt(_pct(r[k])) for k in keys)) for s, r in metrics["strategies"].items()]
        md.add(md.table(strategies, ["strategy", "Acc@1", "Acc@5", "refined Acc@1", "refined Acc@5"]))
    nil = metrics.get("nil")
    if nil:
        md.add(md.title(2, "NIL calibration"))
        md.add(
            f"Random gold concepts whose mentions make up {100 * nil['holdout_fraction']:.0f}% of the mentions "
            f"(seed {nil['seed']}) are held out of the search, so those mentions are out of the KB. Thresholds are "
            "calibrated on dev."
            + (
                f" On test also the mean over {nil['test_hold_outs']} hold-outs (seeds {nil['seed']} to "
                f"{nil['seed'] + nil['test_hold_outs'] - 1}; "
                "mention counts summed): one hold-out is a noisy measure."
                if "test_mean" in nil
                else ""
            )
        )
        nil_rows = []
        splits = {"dev": "dev", "test": "test", "test_mean": f"test, mean of {nil.get('test_hold_outs')} hold-outs"}
        for strategy, threshold in nil["thresholds"].items():
            for split, label in splits.items():
                if split in nil:
                    a = nil[split][strategy]
                    accuracies = [_fmt(_pct(a[k])) for k in ("in_kb_acc", "out_of_kb_acc", "overall_acc")]
                    counts = f"{a['in_kb']} / {a['out_of_kb']}"
                    nil_rows.append((strategy, f"{threshold:.4f}", label, *accuracies, counts))
        header = ["strategy", "threshold", "split", "in-KB acc", "out-of-KB acc", "overall acc"]
        md.add(md.table(nil_rows, [*header, "in-KB / out-of-KB mentions"]))
    boundaries = (metrics.get("end_to_end") or {}).get("boundaries")
    if boundaries:
        md.add(md.title(2, "Boundary errors (end to end)"))
        md.add("Overlapping predicted and gold entities form a group; a group not one exact match is one error.")
        md.add(md.table([(k, str(boundaries[k])) for k in BOUNDARY_CATEGORIES], ["category", "count"]))
        for side in ("extra", "missing"):
            words = ", ".join(f"{w} ({n})" for w, n in boundaries["words"][side][:10])
            md.add(f"Most frequent {side} words: {words or 'none'}.")
    if metrics.get("end_to_end") is None:
        md.add("End-to-end scores: not computed (the pipeline has no `ner`).")
    return md.text + "\n"


def plot(metrics: dict):
    """A matplotlib Figure (Agg canvas): Acc@1 per search strategy, and histograms of the best scores of right
    and wrong gold-mention links, with the calibrated NIL thresholds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    bars, hist, diagram = fig.subplots(1, 3, width_ratios=[3, 2, 2])
    acc = {s: r["acc1"] for s, r in metrics.get("strategies", {}).items()}
    acc = acc or {metrics["pipeline"]["strategy"]: metrics["gold_mentions"]["acc1"]}
    bars.bar(list(acc), [100 * v for v in acc.values()], color="tab:blue")
    bars.set_ylabel("Acc@1 (%)")
    bars.set_title("Gold-mention Acc@1 per search strategy")
    bars.tick_params(axis="x", labelrotation=60)
    scores = metrics["scores"]
    hist.hist([scores["right"], scores["wrong"]], bins=20, label=["right", "wrong"], color=["tab:green", "tab:red"])
    thresholds = (metrics.get("nil") or {}).get("thresholds", {})
    for (strategy, threshold), style in zip(thresholds.items(), (":", "--", "-")):
        hist.axvline(threshold, color="black", linestyle=style, label=f"NIL {strategy}")
    hist.set_yscale("log")  # exact matches (cosine 1) outnumber the rest by far
    hist.set_xlabel("kb_confidence")
    hist.set_ylabel("mentions (log scale)")
    hist.set_title("Confidence of right and wrong links")
    hist.legend()
    bins = (metrics.get("confidence") or {}).get("reliability", [])
    diagram.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    diagram.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", label="kb_confidence")
    diagram.set_xlim(0, 1)
    diagram.set_ylim(0, 1)
    diagram.set_xlabel("mean confidence (bin)")
    diagram.set_ylabel("accuracy (bin)")
    diagram.set_title("Reliability diagram (test)")
    diagram.legend()
    return fig


def _pct(value: float) -> float:
    return round(100 * value, 2)


def _fmt(value: float | None, decimals: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f}"
