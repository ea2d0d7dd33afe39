"""Whole pipelines on disk: `save` writes one atomically with a checksum of every file, `load` checks them all and
names the file when one is damaged, spaCy's own files (config.cfg, tokenizer, vocab, other components) included.

`spacy.load` runs our components' checks (each keeps a `checksums.json` of its own files) but reads spaCy's files
before any of our code runs, so a damaged `tokenizer` or `vocab/strings.json` fails there with spaCy's or msgpack's
error, naming no file, or loads silently changed (a flipped bit inside a string or a weight). `save` adds a
`checksums.json` at the pipeline's root: every file outside our components but `meta.json` (which `spacy package`
rewrites; a damaged one still fails to parse, E988 below), and each component's own list (with the random id of
its save). `load` checks it before `spacy.load`, unless a component was saved again since (its list's id changed:
`nlp.to_disk` over the directory), when the root list is stale and W981 says so. An error raised while spaCy
reads a file of a pipeline without a root list is re-raised as E988 naming that file: the path inside the
pipeline held by the deepest Python frame of the traceback (the part's directory where spaCy's reader is compiled
code: `ner` for a damaged `ner/model`). An installed pipeline package is checked in its data directory. Every
command of the package loads and saves pipelines through these two functions.

    nlp = spacy_conceptnorm.load("training/pipeline")
    spacy_conceptnorm.save(nlp, "my_pipeline")
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import spacy
from spacy.language import Language

from ..errors import ConceptNormError, Errors, Warnings
from .files import CHECKSUMS, check_files, read_checksums, sha256, write_checksums, write_dir_atomically

REWRITTEN = "meta.json"  # not listed: `spacy package` rewrites it (name, version, requirements); config.cfg rules


def save(nlp: Language, path: str | Path) -> None:
    """Write `nlp` to `path` as `nlp.to_disk` does, into a temporary directory swapped in whole, with a
    `checksums.json` at the root for every file that no component's own checksum list covers.

    nlp (Language): The pipeline.
    path (Union[str, Path]): The directory; an existing one is replaced only once the new one is complete.
    """

    def write(tmp: Path) -> None:
        nlp.to_disk(tmp)
        write_checksums(tmp, own_lists=own_lists(tmp), leave_out=[REWRITTEN])

    write_dir_atomically(Path(path), write)


def load(name: str | Path, **kwargs: Any) -> Language:
    """`spacy.load` with every file of a pipeline checked: against the root `checksums.json` that `save` writes
    (if present, unless SPACY_CONCEPTNORM_SKIP_CHECKSUMS is set), and any error while spaCy reads a file raised
    as ConceptNormError (E988) naming the file. A pipeline package (`spacy package`) is checked in its data
    directory.

    name (Union[str, Path]): A pipeline directory or an installed pipeline package's name.
    **kwargs: Passed to `spacy.load` (exclude, disable, config, ...).
    RETURNS (Language): The pipeline.
    """
    path = data_directory(name)
    if path is None:
        return spacy.load(name, **kwargs)
    verify_pipeline(path)
    try:
        return spacy.load(name, **kwargs)
    except ConceptNormError:
        raise
    except Exception as e:  # spaCy, srsly, msgpack and thinc raise many unrelated types on damaged files
        file = file_being_read(e.__traceback__, path) or path
        detail = f"{type(e).__name__}: {e}".strip()
        raise ConceptNormError(Errors.E988.format(path=file, pipeline=path, detail=detail[:500])) from e


def data_directory(name: str | Path) -> Path | None:
    """The directory `spacy.load(name)` reads: `name` itself, or an installed pipeline package's data directory
    (found as spaCy's `load_model_from_init_py` finds it); None when there is none to check."""
    path = Path(name)
    if path.is_dir():
        return path
    if not isinstance(name, str) or not spacy.util.is_package(name):
        return None
    try:
        package = spacy.util.get_package_path(name)
        meta = spacy.util.get_model_meta(package)
        data = package / f"{meta['lang']}_{meta['name']}-{meta['version']}"
    except Exception:  # not a pipeline package as spaCy makes them: spacy.load says what is wrong
        return None
    return data if data.is_dir() else None


def own_lists(path: Path) -> list[str]:
    """The top-level directories of a saved pipeline that keep their own checksum list (our components)."""
    return sorted(d.name for d in path.iterdir() if (d / CHECKSUMS).is_file())


def verify_pipeline(path: Path) -> bool:
    """Check the files of a pipeline directory against its root list (see the module's docstring); False when
    there is none, the checks are off, or the list is stale (W981)."""
    files = read_checksums(path)
    if files is None:
        return False
    parts = own_lists(path)
    resaved = [name for name in parts if files.get(f"{name}/{CHECKSUMS}") != sha256(path / name / CHECKSUMS)]
    for name in resaved:
        read_checksums(path / name)  # a damaged list is named (E981, E004), not taken for a save since
    if resaved:
        warnings.warn(Warnings.W981.format(path=path / CHECKSUMS, parts=", ".join(resaved)), stacklevel=3)
        return False
    check_files(path, files, skip=[*parts, REWRITTEN])
    return True


def file_being_read(tb: TracebackType | None, root: Path) -> Path | None:
    """The path inside `root` that the deepest frame of the traceback holding one (as a local variable) was
    reading: spaCy's readers take their file as a local (`p`, `path`, `location`), so that frame is the reader
    that failed; the longest such path of that frame when it holds several."""
    root = root.resolve()
    found = None
    while tb is not None:
        paths = [p for value in tb.tb_frame.f_locals.values() if (p := _inside(value, root)) is not None]
        if paths:
            found = max(paths, key=lambda p: len(p.parts))
        tb = tb.tb_next
    return found


def _inside(value: Any, root: Path) -> Path | None:
    """`value` as a resolved path strictly inside `root`, if it is a Path or an absolute path string."""
    if isinstance(value, str):
        if not 0 < len(value) < 4096 or not os.path.isabs(value):  # a relative string is no path of the pipeline
            return None
    elif not isinstance(value, Path):
        return None
    try:
        path = Path(value).resolve()
    except (OSError, ValueError, RuntimeError):
        return None
    return path if path != root and path.is_relative_to(root) else None
