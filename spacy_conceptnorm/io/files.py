"""Small I/O helpers: line reading that names file and line on bad bytes, and atomic writes."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import srsly

from ..errors import ConceptNormError, Errors


def read_lines(
    path: str | Path, encoding: str = "utf-8", on_error: Callable[[int, UnicodeDecodeError], None] | None = None
) -> Iterator[tuple[int, str | None]]:
    """Yield (line number, line without its newline) from a text file, gzip-compressed if it ends in .gz.

    Lines end at "\n", "\r\n" or a lone "\r"; a UTF-8 byte order mark before the first line is dropped. Bytes
    are decoded line by line so that a wrong encoding is reported with the file and line it is on: a
    ConceptNormError, or, given `on_error`, a call `on_error(line number, error)` and the line yielded as None.
    A directory, an unreadable file or a truncated or corrupt .gz raises ConceptNormError naming the file.
    """
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    if path.is_dir():
        raise ConceptNormError(Errors.E982.format(path=path, detail="it is a directory, not a file"))
    opener = gzip.open if path.suffix == ".gz" else open
    bom = codecs.BOM_UTF8 if codecs.lookup(encoding).name == "utf-8" else b""
    try:
        # latin-1 maps bytes to characters one to one: the wrapper only finds the line ends (universal newlines)
        with opener(path, "rb") as raw, io.TextIOWrapper(raw, encoding="latin-1", newline=None) as f:
            for lineno, text in enumerate(f, 1):
                data = text.encode("latin-1").removesuffix(b"\n")
                if lineno == 1 and bom:
                    data = data.removeprefix(bom)
                try:
                    line = data.decode(encoding)
                except UnicodeDecodeError as e:
                    if on_error is None:
                        where = f"{path}:{lineno}"
                        raise ConceptNormError(
                            Errors.E005.format(path=where, encoding=encoding, position=e.start, detail=e.reason)
                        ) from None
                    on_error(lineno, e)
                    yield lineno, None
                    continue
                yield lineno, line
    except (PermissionError, IsADirectoryError) as e:
        raise ConceptNormError(Errors.E982.format(path=path, detail=e.strerror)) from None
    except (OSError, EOFError, zlib.error) as e:  # gzip: BadGzipFile, EOFError when truncated, zlib.error
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None


def validation_problems(error: Exception) -> str:
    """A pydantic ValidationError's problems on one line: `unknown key 'x'` or `key = value: message`."""
    problems = []
    for problem in error.errors():  # type: ignore[attr-defined]
        key = ".".join(map(str, problem["loc"]))
        if problem["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r}")
        else:
            problems.append(f"{key} = {problem['input']!r}: {problem['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def current_umask() -> int:
    """The process umask, read when a file is written (not at import, so a later `os.umask` counts). Linux
    reports it in /proc/self/status; elsewhere it is set and put back, as there is no getter."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside `path` and move it into place only when the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it owner-only; give it a plain file's permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, data: object) -> None:
    """Write JSON atomically, with the standard library's json: it writes and reads floats exactly (srsly's ujson
    reads 0.95 back as 0.9500000000000001)."""
    with atomic_open(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def write_dir_atomically(path: str | Path, write: Callable[[Path], None]) -> None:
    """Write a directory under a temporary name beside `path`, then swap it in: a failed or interrupted write
    leaves the previous version."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it owner-only
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(path: str | Path) -> Path:
    """Put back the previous version of a directory that `write_dir_atomically` moved aside when the process was
    killed (kill -9, power loss) before the new version took its place; returns the path."""
    path = Path(path)
    if not path.exists():
        old = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if old:
            old[-1].rename(path)
    return path


def write_msgpack(path: str | Path, data: object) -> None:
    with atomic_open(path) as f:
        f.write(srsly.msgpack_dumps(data))


def read_msgpack(path: str | Path, what: str, expected_format: str, expected_version: int | tuple[int, ...]) -> dict:
    """Read a msgpack file written by `write_msgpack` and check its format tag and version (one of them, given a
    tuple: the first is the current one)."""
    path = Path(path)
    if not path.exists():
        raise ConceptNormError(Errors.E002.format(path=path))
    try:
        data = srsly.msgpack_loads(path.read_bytes())
    except Exception as e:  # msgpack raises several unrelated types on truncation
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
    return check_format(path, data, what, expected_format, expected_version)


def check_format(
    path: Path, data: object, what: str, expected_format: str, expected_version: int | tuple[int, ...]
) -> dict:
    """`data` read from `path`, when it carries the expected format tag and version (one of them, given a tuple:
    the first is the current one); else E003 naming the file."""
    versions = expected_version if isinstance(expected_version, tuple) else (expected_version,)
    found = data.get("format") if isinstance(data, dict) else None
    if found != expected_format or data.get("version") not in versions:
        found_desc = f"{found}/{data.get('version')}" if isinstance(data, dict) else type(data).__name__
        raise ConceptNormError(
            Errors.E003.format(path=path, what=what, found=found_desc, expected=f"{expected_format}/{versions[0]}")
        )
    return data


def read_json(path: str | Path) -> dict:
    """Read a JSON object; a missing, truncated or non-object file raises ConceptNormError naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf8"))
    except FileNotFoundError:
        raise ConceptNormError(Errors.E002.format(path=path)) from None
    except (OSError, ValueError) as e:
        raise ConceptNormError(Errors.E004.format(path=path, detail=f"{type(e).__name__}: {e}")) from None
    if not isinstance(data, dict):
        raise ConceptNormError(Errors.E004.format(path=path, detail="not a JSON object"))
    return data


def read_settings(path: str | Path, what: str, expected_format: str, expected_version: int) -> dict:
    """A JSON object with a format tag and version (checked, then left out): a saved model's settings."""
    data = check_format(Path(path), read_json(path), what, expected_format, expected_version)
    return {k: v for k, v in data.items() if k not in ("format", "version")}


# --- checksums of saved directories -------------------------------------------------------------------------------
CHECKSUMS = "checksums.json"
SKIP_CHECKSUMS = "SPACY_CONCEPTNORM_SKIP_CHECKSUMS"  # set to 1 to load saved pipelines without checking them


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _listing_digest(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode("utf8")).hexdigest()


def write_checksums(root: str | Path, own_lists: Iterable[str] = (), leave_out: Iterable[str] = ()) -> None:
    """Record the sha256 of every file below `root` in `root/checksums.json` (dot-files, the leftovers of
    interrupted writes, and the top-level names in `leave_out` aside), with a checksum of the list itself and a
    random id of this save. Of a top-level directory in `own_lists`, which keeps its own list, only that list is
    recorded (its id tells whether the directory was saved again since)."""
    root = Path(root)
    own_lists, leave_out = set(own_lists), set(leave_out)

    def listed(parts: tuple[str, ...]) -> bool:
        if parts[0] in leave_out or any(part.startswith(".") for part in parts):
            return False
        return parts[1:] == (CHECKSUMS,) if parts[0] in own_lists else parts[-1] != CHECKSUMS

    files = {
        p.relative_to(root).as_posix(): sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and listed(p.relative_to(root).parts)
    }
    listing = {"algorithm": "sha256", "files": files, "listing": _listing_digest(files), "save_id": uuid.uuid4().hex}
    write_json(root / CHECKSUMS, listing)


def checksums_skipped() -> bool:
    return os.environ.get(SKIP_CHECKSUMS, "").strip().lower() not in ("", "0", "false", "no")


def read_checksums(root: str | Path) -> dict[str, str] | None:
    """The files and digests recorded in `root/checksums.json`: None when there is no list (a directory saved
    before checksums existed) or SPACY_CONCEPTNORM_SKIP_CHECKSUMS is set; E981 when the list fails its own check."""
    root = Path(root)
    manifest = root / CHECKSUMS
    if checksums_skipped() or not manifest.exists():
        return None
    data = read_json(manifest)
    files = data.get("files")
    if not isinstance(files, dict) or data.get("listing") != _listing_digest(files):
        raise ConceptNormError(Errors.E981.format(path=root, manifest=manifest, problem="corrupt (its own checksum)"))
    return files


def check_files(root: Path, files: dict[str, str], skip: Iterable[str] = ()) -> None:
    """Check the files of a list `read_checksums(root)` gave, except those in `skip` (a top-level name skips all
    below it; a relative path, that file): ConceptNormError naming the first file that is missing or differs."""
    skip = set(skip)
    for name, digest in files.items():
        path = root / name
        if name.split("/")[0] in skip or name in skip:
            continue
        if not path.is_file():
            raise ConceptNormError(Errors.E984.format(path=path, manifest=root / CHECKSUMS))
        if sha256(path) != digest:
            raise ConceptNormError(Errors.E980.format(path=path, manifest=root / CHECKSUMS))
