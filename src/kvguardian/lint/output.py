"""Output formats of ``kv-guardian lint``: ``text`` (``path:line:col: ID message``, like ruff), ``json``,
``github`` (workflow-command annotations) and ``sarif`` (`kvguardian.lint.sarif`).

Paths and messages come from the files we read: control, bidi and format characters are escaped (as
`kvguardian.core.report.escape.visible` does everywhere else), and so are the undecodable bytes of a file name,
never printed raw.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvguardian import __version__
from kvguardian.core.report.escape import visible
from kvguardian.lint.diagnostic import LintResult

__all__ = ["FORMATS", "clean", "render"]

FORMATS = ("text", "json", "sarif", "github")
_UNDECODED = re.compile("[\udc80-\udcff]")  # a file name's non-UTF-8 bytes, as os.fsdecode gives them


def clean(text: str) -> str:
    """``text`` safe for a terminal: control, bidi and format characters as escapes (``\\x1b``, ``\\u202e``:
    `kvguardian.core.report.escape.visible`) and a file name's undecodable bytes as ``\\xNN``."""
    return _UNDECODED.sub(lambda m: f"\\x{ord(m.group()) - 0xdc00:02x}", visible(text))


def render_text(result: LintResult) -> str:
    lines = [f"{clean(d.path)}:{d.line}:{d.col}: {d.rule} {clean(d.message)}" for d in result.diagnostics]
    n = len(result.diagnostics)
    files = f"{result.files} file{'s' if result.files != 1 else ''}"
    summary = f"Found {n} finding{'s' if n != 1 else ''} in {files}" if n else f"No findings in {files}"
    if result.skipped:
        summary += f" ({len(result.skipped)} skipped)"
    if result.suppressed:
        summary += f"; {result.suppressed} silenced by noqa"
    lines.append(summary + ".")
    return "\n".join(lines)


def render_json(result: LintResult) -> str:
    data: dict[str, Any] = {
        "tool": "kv-guardian lint",
        "version": __version__,
        "files": result.files,
        "lines": result.lines,
        "counts": result.counts(),
        "suppressed": result.suppressed,
        "findings": [
            {"id": d.rule, "name": d.name, "severity": d.severity.value, "path": d.path, "line": d.line,
             "col": d.col, "end_line": d.end_line or d.line, "end_col": d.end_col or d.col, "message": d.message}
            for d in result.diagnostics
        ],
        "skipped": [{"path": s.path, "line": s.line, "reason": s.reason} for s in result.skipped],
    }
    return json.dumps(data, indent=2, ensure_ascii=True)


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(result: LintResult) -> str:
    """GitHub Actions annotations: ``::warning file=…,line=…,col=…,title=…::message``."""
    out = []
    for d in result.diagnostics:
        level = "error" if d.severity.value == "error" else "warning"
        props = f"file={_gh_prop(clean(d.path))},line={d.line},col={d.col}"
        if d.end_line:
            props += f",endLine={d.end_line}"
        out.append(f"::{level} {props},title={_gh_prop(f'{d.rule} {d.name}')}::{_gh_data(clean(d.message))}")
    for s in result.skipped:
        line = f",line={s.line}" if s.line else ""
        title = "title=kv-guardian lint skipped"
        out.append(f"::notice file={_gh_prop(clean(s.path))}{line},{title}::{_gh_data(clean(s.reason))}")
    return "\n".join(out)


def render(result: LintResult, fmt: str) -> str:
    if fmt == "text":
        return render_text(result)
    if fmt == "json":
        return render_json(result)
    if fmt == "github":
        return render_github(result)
    from kvguardian.lint.sarif import render_sarif

    return render_sarif(result)
