"""SARIF 2.1.0 output, as GitHub code scanning accepts it: one run, every lint rule described in
``tool.driver.rules`` (with its catalog fix and its module docstring as help), results with a relative
``artifactLocation`` under ``%SRCROOT%``, a region and a ``partialFingerprints`` hash, and skipped files as
``toolExecutionNotifications``. A test validates the output against the SARIF 2.1.0 JSON schema.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

from kvguardian import __version__
from kvguardian.core.findings import CATALOG
from kvguardian.lint.diagnostic import Diagnostic, LintResult
from kvguardian.lint.rules import RULES

__all__ = ["SARIF_SCHEMA", "render_sarif"]

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _uri(path: str) -> str:
    """A relative URI (or a ``file:`` one outside the working directory), percent-encoding the file name's bytes
    as the file system has them: a non-UTF-8 name's undecodable bytes included."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return p.as_uri()
    return quote_from_bytes(os.fsencode(p.as_posix().removeprefix("./")))


def _shown(path: str) -> str:
    """``path`` for a message: a non-UTF-8 name's bytes as ``\\xNN`` (JSON has no lone surrogates)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _rule(rule_id: str) -> dict[str, Any]:
    kind = CATALOG[rule_id]
    doc = RULES[rule_id].doc.strip()
    return {
        "id": rule_id,
        "name": "".join(w.capitalize() for w in kind.name.split("-")),
        "shortDescription": {"text": kind.meaning},
        "fullDescription": {"text": doc.splitlines()[0] if doc else kind.meaning},
        "help": {"text": f"Fix: {kind.fix}", "markdown": doc or kind.fix},
        "defaultConfiguration": {"level": _LEVEL[kind.severity.value]},
        "properties": {"tags": ["kv-cache", "memory-leak"], "problem.severity": kind.severity.value},
    }


def _fingerprint(d: Diagnostic, line_text: str) -> str:
    h = hashlib.sha256(f"{d.rule}:{line_text.strip()}".encode()).hexdigest()[:16]
    return f"{h}:1"


def _line_text(path: str, line: int, cache: dict[str, list[str]]) -> str:
    if path not in cache:
        try:
            cache[path] = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def render_sarif(result: LintResult) -> str:
    ids = list(RULES)
    index = {rid: i for i, rid in enumerate(ids)}
    cache: dict[str, list[str]] = {}
    results = []
    for d in result.diagnostics:
        region: dict[str, int] = {"startLine": d.line, "startColumn": d.col}
        if d.end_line >= d.line:
            region["endLine"] = d.end_line
            if d.end_col > 0 and (d.end_line > d.line or d.end_col > d.col):
                region["endColumn"] = d.end_col
        results.append({
            "ruleId": d.rule,
            "ruleIndex": index[d.rule],
            "level": _LEVEL[d.severity.value],
            "message": {"text": d.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": _uri(d.path), "uriBaseId": "%SRCROOT%"},
                "region": region,
            }}],
            "partialFingerprints": {"primaryLocationLineHash": _fingerprint(d, _line_text(d.path, d.line, cache))},
        })
    notifications = [{
        "level": "note",
        "message": {"text": f"{_shown(s.path)}: {s.reason}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(s.path), "uriBaseId": "%SRCROOT%"}}}],
    } for s in result.skipped]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "kv-guardian",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": "https://example.invalid/kv-guardian",
                "rules": [_rule(r) for r in ids],
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
            "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
            "results": results,
            "columnKind": "unicodeCodePoints",
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=True)
