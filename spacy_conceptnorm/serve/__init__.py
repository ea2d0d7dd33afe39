"""The curation page: `python -m spacy_conceptnorm serve MODEL --annotations OUT.jsonl`.

A FastAPI app (uvicorn) over the output of `annotate`: the mentions worst first (NIL, then the lowest confidence),
filtered by concept, label, document, status or text; per mention its sentence, the chosen concept and matched
name, and the other candidates. The reviewer accepts a link, chooses another candidate, searches the knowledge
base and picks any concept, marks NIL, adds the mention as a synonym of a concept (the linker answers with it at
once, and the loaded mentions of that text are re-linked and shown), and undoes. NIL mentions are grouped into
candidate new concepts.

Files: every decision is appended to the reviews JSONL (default OUT.reviews.jsonl; `store.ReviewLog`), the state
is rebuilt from it at start; the synonyms in force are rewritten atomically to OUT.synonyms.jsonl (apply them with
`apply_synonyms(nlp, path)` after `spacy.load`), and with `--save-model DIR` the page's "Save pipeline" writes the
whole pipeline, synonyms included, to DIR (swapped in whole) for `spacy.load(DIR)`.

Modules: `store` (files), `curation` (the session), `nil_groups` (NIL grouping), `app` (HTTP and security; the only
one that needs the `serve` extra: fastapi, uvicorn).
"""

from __future__ import annotations

from pathlib import Path

from spacy.language import Language

from ..errors import ConceptNormError, Errors
from ..io.pipelines import load
from .curation import Curation, CurationError, Filters
from .nil_groups import NIL_METHODS
from .store import Annotations, Mention, ReviewLog, apply_synonyms, read_annotations, read_synonyms, write_synonyms

__all__ = [
    "Annotations", "Curation", "CurationError", "Filters", "Mention", "ReviewLog", "apply_synonyms", "default_paths",
    "load_curation", "read_annotations", "read_synonyms", "run_server", "write_synonyms",
]  # fmt: skip


def default_paths(annotations: str | Path) -> tuple[Path, Path]:
    """The reviews and synonyms files beside an annotate output: OUT.reviews.jsonl, OUT.synonyms.jsonl."""
    annotations = Path(annotations)
    return annotations.with_suffix(".reviews.jsonl"), annotations.with_suffix(".synonyms.jsonl")


def load_curation(
    model: str | Path | Language,
    annotations: str | Path,
    reviews: str | Path | None = None,
    synonyms: str | Path | None = None,
    documents: str | Path | None = None,
    save_dir: str | Path | None = None,
    nil_method: str = "coder",
) -> Curation:
    """A curation session over an annotate output, with the decisions of the reviews file replayed.

    model (Union[str, Path, Language]): The pipeline that annotated (a directory or package for `spacy.load`).
    annotations (Union[str, Path]): The JSONL output of `annotate` (best written with --include-text).
    reviews (Optional[Union[str, Path]]): The reviews log; default OUT.reviews.jsonl.
    synonyms (Optional[Union[str, Path]]): The synonyms file; default OUT.synonyms.jsonl.
    documents (Optional[Union[str, Path]]): The annotate input, for the texts when OUT has none.
    save_dir (Optional[Union[str, Path]]): Where "Save pipeline" writes the pipeline; None: not offered.
    nil_method (str): NIL grouping: "coder" (CODER++ term clustering) or "text" (see `serve.nil_groups`).
    RETURNS (Curation): The session.
    """
    if nil_method not in NIL_METHODS:
        raise ConceptNormError(Errors.E973.format(value=nil_method, choices=NIL_METHODS))
    default_reviews, default_synonyms = default_paths(annotations)
    nlp = model if isinstance(model, Language) else load(model)
    return Curation(
        nlp,
        read_annotations(annotations, documents),
        ReviewLog(reviews or default_reviews),
        Path(synonyms or default_synonyms),
        Path(save_dir) if save_dir else None,
        nil_method,
    )


def run_server(curation: Curation, host: str = "127.0.0.1", port: int = 8000, token: str | None = None) -> None:
    """Serve the page with uvicorn until interrupted; refuses an address other than loopback without a token."""
    import uvicorn

    from .app import check_bind, create_app

    check_bind(host, token)
    allowed = list(("localhost", "127.0.0.1") if host in ("localhost", "127.0.0.1") else ["*"])
    uvicorn.run(create_app(curation, token, allowed), host=host, port=port, log_level="warning")
