"""The metric names a PromQL expression selects, and which metric names exist (for dashboard and rule checks).

`metric_names` is a small lexer, not a parser: it skips strings, label matchers, range/subquery brackets,
grouping label lists (``by``, ``without``, ``on``, ``ignoring``, ``group_left``, ``group_right``), function
and aggregation names, keywords and numbers/durations; every other identifier is a metric name (plus the
value of a ``__name__="..."`` matcher). Syntax is left to promtool, which the checks run as well.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from kvguardian.core.errors import UsageError

__all__ = ["GRAFANA_INTERVALS", "metric_names", "recording_rule_names", "substitute_grafana"]

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<number>[0-9][0-9a-zA-Z_.]*|\.[0-9][0-9a-zA-Z_.]*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@])
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                 "topk", "quantile", "limitk", "limit_ratio"}

#: Grafana's interval variables, replaced by a duration before an expression is checked.
GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise UsageError(f"unexpected character {expr[pos]!r} at {pos} in PromQL {expr!r}")
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            out.append((kind, m.group()))
        pos = m.end()
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names selected by ``expr`` (recording-rule names included)."""
    toks = _tokens(expr)
    names: set[str] = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text == "{":  # label matchers: only __name__ selects a metric
            j = i + 1
            while j < len(toks) and toks[j][1] != "}":
                if toks[j][1] == "__name__" and j + 2 < len(toks) and toks[j + 1][1] == "=":
                    names.add(toks[j + 2][1][1:-1])
                j += 1
            i = j + 1
            continue
        if text == "[":  # a range or subquery: durations only
            while i < len(toks) and toks[i][1] != "]":
                i += 1
            i += 1
            continue
        if kind == "ident":
            if text in _GROUPING and nxt == "(":  # a label list: skip to its ")"
                i += 2
                while i < len(toks) and toks[i][1] != ")":
                    i += 1
                i += 1
                continue
            is_call = nxt == "(" or (text in _AGGREGATIONS and nxt in ("by", "without"))
            if not is_call and text not in _KEYWORDS and text not in _GROUPING:
                names.add(text)
        i += 1
    return names


def substitute_grafana(expr: str, interval: str = "5m") -> str:
    """Replace Grafana's interval variables by ``interval``; raises `UsageError` for any other ``$variable``."""
    for var in GRAFANA_INTERVALS:
        expr = expr.replace(var, interval)
    left = re.findall(r"\$\{?\w+\}?", expr)
    if left:
        raise UsageError(f"PromQL {expr!r} uses template variable(s) {left}; only {GRAFANA_INTERVALS} are known")
    return expr


def recording_rule_names(rule_files: Iterable[Path]) -> set[str]:
    """Names recorded by Prometheus rule files (``record:`` entries)."""
    import yaml

    names: set[str] = set()
    for path in rule_files:
        doc = yaml.safe_load(path.read_text()) or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "record" in rule:
                    names.add(rule["record"])
    return names
