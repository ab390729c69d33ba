"""The one reporter interface: both reporters take every block, escape data, never parse markup."""

import io
import json

import pytest

from kvguardian.core.findings import Finding, Report, Severity
from kvguardian.core.report.console import ConsoleReporter
from kvguardian.core.report.json import JsonReporter
from kvguardian.core.report.reporter import FORMATS, Reporter, make_reporter, reporting

HOSTILE = ["[/oops]", "[bold red]markup[/]:7", "a\x1b[2Jb", "\x1b]0;title\x07", "x\nkv-guardian: all clear",
           "cr\rover", "rtl\u202eevil", ":smile:", "tab\there"]


def all_blocks(out: Reporter, name: str) -> None:
    out.heading(f"heading {name}")
    out.text(f"text {name}", tone="warning")
    out.table(f"title {name}", ["col", name], [[name, 1], [2, name]])
    f = Finding("KVG102", Severity.ERROR, f"message {name}", {"key": name}, holder_chain=[f"module m: {name}", "x"],
                fix=f"fix {name}")
    out.finding(f)
    out.findings(Report(findings=[f, Finding("KVG305", Severity.INFO, name)]))
    out.result({"name": name, "nan": float("nan")})


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_takes_every_block(fmt):
    buf = io.StringIO()
    with reporting(fmt, buf) as out:
        all_blocks(out, "plain")
    assert buf.getvalue()


@pytest.mark.parametrize("name", HOSTILE)
def test_console_shows_data_as_itself_with_control_characters_visible(name):
    buf = io.StringIO()
    all_blocks(ConsoleReporter(buf), name)
    text = buf.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text and "\t" not in text
    assert not any(line.startswith("kv-guardian: all clear") for line in text.splitlines()), "no forged line"
    if name.startswith("["):
        assert text.count(name) >= 5, "markup is shown, not interpreted"
    assert "😄" not in text


def test_console_findings_group_and_count():
    fs = [Finding("KVG102", Severity.ERROR, f"m{i}", holder_chain=["module a: X", "y"]) for i in range(5)]
    buf = io.StringIO()
    ConsoleReporter(buf).findings(Report(findings=fs), per_group=2, more="--report")
    text = buf.getvalue()
    assert text.count("KVG102 orphaned-kv (error)") == 2 and "… and 3 more like this (see --report)" in text
    assert text.strip().endswith("5 finding(s): 5 error, 0 warning, 0 info")


@pytest.mark.parametrize("name", HOSTILE)
def test_json_is_valid_and_carries_no_raw_control_or_bidi_characters(name):
    buf = io.StringIO()
    with reporting("json", buf) as out:
        all_blocks(out, name)
    text = buf.getvalue()
    assert json.loads(text) == {"name": name, "nan": None}
    assert "\x1b" not in text and "\u202e" not in text and "NaN" not in text


def test_json_without_a_result_writes_the_findings_report():
    buf = io.StringIO()
    out = JsonReporter(buf)
    out.findings(Report(findings=[Finding("KVG305", Severity.INFO, "x")]))
    out.close()
    assert json.loads(buf.getvalue())["counts"]["info"] == 1


def test_an_unknown_format_is_a_usage_error():
    from kvguardian.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown output format 'xml'; use one of: console, json, html"):
        make_reporter("xml")
