"""The documentation's runnable examples run, and print what the page says they print.

A fenced ``python`` or ``bash`` block with ``<!-- run -->`` on the line before it is an example; a ``text`` block
after ``<!-- output -->`` right after it is its expected output (stdout and stderr together). In the expected
output a line ``...`` stands for any number of lines and ``...`` inside a line for any text; the rest must match
exactly. Options in the marker: ``exit=N`` (the expected exit code, default 0) and ``needs=a,b`` (binaries the
block needs: skipped locally without them, failed in CI). A page's examples run in order, in one fresh folder,
with the repository's virtualenv first on PATH (docs/development.md, "Runnable examples").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvg_testing import ROOT, require_binary

DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
TIMEOUT_S = 300  # one example; the slow ones build the tiny model (a few seconds on an idle machine)

_RUN = re.compile(r"^<!--\s*run\b(?P<options>[^>]*?)\s*-->\s*$")
_OUTPUT = re.compile(r"^<!--\s*output\s*-->\s*$")
_FENCE = re.compile(r"^(?P<fence>```+)\s*(?P<lang>[\w-]*)\s*$")

pytestmark = pytest.mark.slow


@dataclass
class Example:
    where: str  # docs/PAGE.md:LINE of the marker
    lang: str  # python or bash
    code: str
    exit_code: int = 0
    needs: list[str] = field(default_factory=list)
    expected: str | None = None


def _block(lines: list[str], start: int, where: str) -> tuple[str, str, int]:
    """(language, body, index after the closing fence) of the fenced block that starts at ``lines[start]``."""
    opening = _FENCE.match(lines[start]) if start < len(lines) else None
    if opening is None:
        raise ValueError(f"{where}: the marker must be followed by a fenced code block")
    fence = opening.group("fence")
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == fence:
            return opening.group("lang"), "\n".join(lines[start + 1:end]) + "\n", end + 1
    raise ValueError(f"{where}: the code block is not closed")


def _next(lines: list[str], i: int) -> int:
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def parse(text: str, page: str) -> list[Example]:
    """The runnable examples of a page, in order."""
    lines = text.splitlines()
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        marker = _RUN.match(lines[i])
        if _OUTPUT.match(lines[i]):
            raise ValueError(f"{page}:{i + 1}: an output block must follow a runnable block")
        if marker is None:
            i += 1
            continue
        where = f"{page}:{i + 1}"
        options = dict(word.split("=", 1) for word in marker.group("options").split())
        unknown = set(options) - {"exit", "needs"}
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; use exit=N, needs=a,b")
        lang, code, i = _block(lines, _next(lines, i + 1), where)
        if lang not in ("python", "bash"):
            raise ValueError(f"{where}: a runnable block is python or bash, not {lang!r}")
        example = Example(where, lang, code, int(options.get("exit", 0)),
                          [n for n in options.get("needs", "").split(",") if n])
        after = _next(lines, i)
        if after < len(lines) and _OUTPUT.match(lines[after]):
            out_lang, example.expected, i = _block(lines, _next(lines, after + 1), f"{page}:{after + 1}")
            if out_lang != "text":
                raise ValueError(f"{page}:{after + 1}: the expected output is a text block")
        examples.append(example)
    return examples


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` with its ``...`` filled in (see the module docstring)."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(map(re.escape, line.split("..."))) + r"[ \t]*\n")
    return re.fullmatch("".join(parts), actual.rstrip("\n") + "\n", re.S) is not None


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts and "<!-- run" in p.read_text())


def run(example: Example, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "120",
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1"}
    env.pop("KVG_DEBUG", None)
    if example.lang == "python":
        script = folder / "example.py"
        script.write_text(example.code)
        argv = [str(VENV_BIN / "python"), str(script)]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", example.code]
    return subprocess.run(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S)


def test_the_tutorials_have_runnable_examples():
    found = {p.relative_to(DOCS).as_posix(): parse(p.read_text(), p.name) for p in pages()}
    for page in ("getting-started.md", "tutorials/hf-app.md", "tutorials/redis-operator.md", "tutorials/platform.md"):
        assert found.get(page), f"docs/{page} has no runnable example"
    assert sum(len(e) for e in found.values()) <= 12, "keep the runnable set small and fast"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_examples_run_and_print_what_the_page_shows(page, tmp_path):
    for example in parse(page.read_text(), f"docs/{page.relative_to(DOCS).as_posix()}"):
        for binary in example.needs:
            require_binary(binary)
        proc = run(example, tmp_path)
        assert proc.returncode == example.exit_code, (
            f"{example.where}: exit code {proc.returncode}, the page expects {example.exit_code}\n{proc.stdout}")
        if example.expected is not None:
            assert matches(example.expected, proc.stdout), (
                f"{example.where}: the output differs from the page's\n--- page\n{example.expected}"
                f"--- printed\n{proc.stdout}")


PAGE = """intro
<!-- run exit=1 needs=true -->
```bash
echo hi
```

<!-- output -->
```text
...
last ... line
```
<!-- run -->
```python
print(1)
```
"""


def test_the_parser_reads_markers_options_and_outputs():
    first, second = parse(PAGE, "p.md")
    assert (first.lang, first.code, first.exit_code, first.needs) == ("bash", "echo hi\n", 1, ["true"])
    assert first.expected == "...\nlast ... line\n" and first.where == "p.md:2"
    assert (second.lang, second.expected) == ("python", None)
    for bad, message in (("<!-- run -->\ntext", "fenced code block"),
                         ("<!-- run -->\n```toml\nx\n```", "python or bash"),
                         ("<!-- run nope=1 -->\n```bash\nx\n```", "unknown option"),
                         ("<!-- output -->", "must follow"), ("<!-- run -->\n```bash\nx\n", "not closed")):
        with pytest.raises(ValueError, match=message):
            parse(bad, "p.md")


@pytest.mark.parametrize("expected, actual, ok", [
    ("a\nb\n", "a\nb\n", True),
    ("a\nb\n", "a\nc\n", False),
    ("a\n", "a\nb\n", False),  # nothing may be left over without a '...' line
    ("a\n...\nz\n", "a\nb\nc\nz\n", True),
    ("a\n...\nz\n", "a\nz\n", True),
    ("took ... s\n", "took 0.31 s\n", True),
    ("took ... s\n", "took 0.31 ms\n", False),
    ("x.y\n", "xzy\n", False),  # the rest is literal, not a pattern
    ("a ... z\n", "a b\nz\n", False),  # '...' inside a line stays inside it
])
def test_the_output_matcher(expected, actual, ok):
    assert matches(expected, actual) is ok
