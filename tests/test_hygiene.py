"""Importing the package changes nothing process-wide once torch is loaded (imported before torch, it sets
OMP_WAIT_POLICY=PASSIVE if unset: tests/test_reliability.py); checkpoints and models are loaded without running
code."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "spacy_conceptnorm"

CODE = """
import os, torch
torch.set_num_threads(2)
os.environ.pop("TOKENIZERS_PARALLELISM", None)
import spacy_conceptnorm, spacy_conceptnorm.cli, spacy_conceptnorm.annotate, spacy_conceptnorm.training
import spacy_conceptnorm.evaluation.linking


def threads_in_a_forked_child():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(torch.get_num_threads()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return int(os.read(read, 16))


print(threads_in_a_forked_child(), "TOKENIZERS_PARALLELISM" in os.environ)
from spacy_conceptnorm.search.index import VectorIndex
VectorIndex(4)  # the first index installs the fork hook
print(threads_in_a_forked_child())

from spacy_conceptnorm.io.files import atomic_open
os.umask(0o027)  # changed after import: files written later follow it
with atomic_open(os.path.join({tmp!r}, "f"), "wb") as f:
    f.write(b"x")
print(oct(os.stat(os.path.join({tmp!r}, "f")).st_mode & 0o777))
"""


def test_import_has_no_process_wide_side_effects(tmp_path):
    code = CODE.format(tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["2 False", "1", "0o640"]


def test_no_code_runs_when_loading_checkpoints_or_models():
    """Every `torch.load` passes `weights_only=True`; `trust_remote_code` is never set to anything but False."""
    loads = 0
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            where = f"{path}:{node.lineno}"
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "load" and getattr(func.value, "id", None) == "torch":
                loads += 1
                weights_only = keywords.get("weights_only")
                assert isinstance(weights_only, ast.Constant) and weights_only.value is True, where
            remote = keywords.get("trust_remote_code")
            assert remote is None or (isinstance(remote, ast.Constant) and remote.value is False), where
    assert loads >= 1  # the trainer's checkpoint
