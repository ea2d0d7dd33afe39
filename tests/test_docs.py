"""The docs work as written: every ```python block of README.md, CHANGELOG.md, CONTRIBUTING.md and docs/*.md runs,
and every relative link points to a file (and a heading, where it names one).

A block that needs something the fast set does not have is marked by an HTML comment on the line before it:
`<!-- test: needs PATH -->` (PATH relative to the repository root, e.g. `training/pipeline`, the trained pipeline
of `spacy project run all`, or `../shared/data/medic`) runs in the slow set and skips where PATH is absent;
`<!-- test: slow -->` runs in the slow set. Several clauses are separated by `;`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*test:\s*(.*?)\s*-->\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass
class Block:
    """A fenced code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    needs: list[str] = field(default_factory=list)
    slow: bool = False

    @property
    def name(self) -> str:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{where} line {self.line}"


def read_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the test marker of the line before each (fences may be
    indented, inside a list item; the block's lines lose that indent)."""
    lines = path.read_text(encoding="utf8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1  # the closing fence
        block = Block(path, start + 1, language.lower(), "\n".join(body) + "\n")
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        if marker:
            for clause in filter(None, (c.strip() for c in marker.group(1).split(";"))):
                if clause == "slow":
                    block.slow = True
                elif clause.startswith("needs "):
                    block.needs.append(clause[len("needs ") :].strip())
                    block.slow = True
                else:
                    raise ValueError(f"{block.name}: unknown test marker clause {clause!r}")
        blocks.append(block)
    return blocks


def python_blocks() -> list:
    params = []
    for path in DOCS:
        for index, block in enumerate(b for b in read_blocks(path) if b.language == "python"):
            marks = [pytest.mark.slow] if block.slow else []
            block_id = f"{path.relative_to(ROOT)}-block{index}-line{block.line}"
            params.append(pytest.param(block, id=block_id, marks=marks))
    return params


@pytest.mark.parametrize("block", python_blocks())
def test_python_block_runs(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block runs as written, in a namespace of its own, from the repository root."""
    missing = [need for need in block.needs if not (ROOT / need).exists()]
    if missing:
        pytest.skip(f"{block.name} needs {', '.join(missing)}")
    monkeypatch.chdir(ROOT)
    exec(compile(block.code, f"<{block.name}>", "exec"), {"__name__": "__docs__"})


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks), numbered as GitHub numbers repeats."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(path):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fence = [], None
    for line in path.read_text(encoding="utf8").splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line)
    return lines


def relative_links(path: Path) -> list[str]:
    """The targets of a Markdown file's links and images that name no scheme (http:, mailto:, ...), also where a
    link's text runs over a line break."""
    prose = INLINE_CODE.sub("", "\n".join(prose_lines(path)))
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path: Path) -> None:
    """Every relative link of the file names an existing file, and a heading of it where it gives an anchor."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


def test_docs_have_links_and_blocks() -> None:
    """The parsers above find what is there: the README links to the docs and holds Python blocks."""
    readme = ROOT / "README.md"
    assert "docs/benchmarks.md#linking-accuracy" in relative_links(readme)
    assert any(b.language == "python" for b in read_blocks(readme))


def test_readme_is_a_guide() -> None:
    """The README stays short and carries no development history (commit hashes, issue numbers)."""
    readme = (ROOT / "README.md").read_text(encoding="utf8")
    assert len(readme.splitlines()) <= 300
    for path in DOCS:
        text = path.read_text(encoding="utf8")
        history = re.findall(r"\b[0-9a-f]{7,40}\b|issue [0-9]|session", text)
        assert not history, f"{path.relative_to(ROOT)}: {history}"


def section(path: Path, title: str) -> list[str]:
    """The lines of a Markdown file under the `## title` heading, up to the next heading of that level or above."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf8").splitlines():
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) <= 2:
            inside = heading.group(2) == title
        elif inside:
            lines.append(line)
    return lines


def test_readme_develop_installs_what_ci_runs() -> None:
    """The README's Develop section stays short (the rest is CONTRIBUTING.md), and its install and test commands are
    those `.ci/run` runs: the same extras and the same packages without their dependencies, Chromium for the browser
    test, the fast and the slow set. So a newcomer's test run skips nothing that CI runs."""
    readme = ROOT / "README.md"
    develop = [line for line in section(readme, "Develop") if line.strip()]
    assert develop and len(develop) <= 6, develop
    assert "CONTRIBUTING.md" in LINK.findall("\n".join(develop))
    text, ci = "\n".join(develop), (ROOT / ".ci" / "run").read_text(encoding="utf8")
    extras = re.compile(r'-e "\.\[([\w,]+)\]"')
    no_deps = re.compile(r"--no-deps((?:\s+[\w.-]+==[\w.]+)+)")
    assert set(extras.search(text).group(1).split(",")) == set(extras.search(ci).group(1).split(","))
    assert sorted(no_deps.search(text).group(1).split()) == sorted(no_deps.search(ci).group(1).split())
    assert "apt-get install -y chromium" in text and "install -y -q chromium" in ci
    assert "python -m pytest -q -m slow" in text and "pytest_set -m slow" in ci
    assert not section(readme, "Run the tests")


def test_markers_and_fences_are_read(tmp_path: Path) -> None:
    """A marker applies to the block right after it (blank lines between allowed), an indented fence's block
    loses the indent, and an unknown clause is an error."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- test: needs training/pipeline -->\n\n```python\nx = 1\n```\n\n"
        "- item\n\n  ```python\n  if True:\n      y = 2\n  ```\n"
        "<!-- test: slow -->\n```bash\nls\n```\n",
        encoding="utf8",
    )
    first, second, third = read_blocks(doc)
    assert (first.needs, first.slow, first.code) == (["training/pipeline"], True, "x = 1\n")
    assert (second.needs, second.slow, second.code) == ([], False, "if True:\n    y = 2\n")
    assert (third.language, third.slow) == ("bash", True)
    doc.write_text("<!-- test: later -->\n```python\npass\n```\n", encoding="utf8")
    with pytest.raises(ValueError, match="unknown test marker clause 'later'"):
        read_blocks(doc)


def test_slug_follows_github() -> None:
    assert slug("Mondal et al.'s CNN") == "mondal-et-als-cnn"
    assert slug("`link_filter`") == "link_filter"
    assert slug("Workflow: `spacy project`") == "workflow-spacy-project"
