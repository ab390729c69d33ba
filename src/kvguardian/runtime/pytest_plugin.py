"""pytest plugin (``pytest11`` entry point ``kvguardian``): fail a test when KV it created outlives it.

    @pytest.mark.kv_no_leak
    def test_chat_turn(model):
        chat(model, "hi")                        # every transformers cache of the process is audited

A marked test (or every test with ``--kv-no-leak-all``) runs with a fresh process guard; after it, ``check``
runs and the test fails when a finding reaches ``fail_on`` (default ``info``) and the orphaned bytes exceed
``allow_bytes``. Options: ``--kv-fail-on``, ``--kv-holder-seconds``, ``--kv-redact``, ``--kv-report``,
``--kv-html`` (each also an ini key). The options table: docs/design/guard.md.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.core.findings import Report, Severity

__all__ = ["KVGuardianPlugin", "kv_guard", "leak_failure_text"]

_SEVERITIES = ("info", "warning", "error")
_HTML_TIMELINES = 200  # checked tests whose timeline the --kv-html page keeps regardless of findings


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kv-guardian", "KV-cache leak checks (kv-guardian)")
    group.addoption("--kv-no-leak-all", action="store_true", default=None,
                    help="treat every test as marked kv_no_leak (ini: kv_no_leak_all)")
    group.addoption("--kv-fail-on", choices=_SEVERITIES, default=None,
                    help="severity that fails a kv_no_leak test (ini: kv_fail_on; default info)")
    group.addoption("--kv-holder-seconds", type=float, default=None,
                    help="wall-clock safety net of the holder-chain search per test (ini: kv_holder_seconds; "
                         "default 120; the search is bounded by objects visited)")
    group.addoption("--kv-redact", action="store_true", default=None,
                    help="hide dictionary keys in holder chains (ini: kv_redact)")
    group.addoption("--kv-report", default=None, metavar="FILE",
                    help="append each checked test's findings to FILE as JSON lines (ini: kv_report)")
    parser.addini("kv_no_leak_all", "treat every test as marked kv_no_leak", type="bool", default=False)
    parser.addini("kv_fail_on", "severity that fails a kv_no_leak test", default="info")
    parser.addini("kv_holder_seconds", "wall-clock safety net of the holder-chain search per test",
                  default="120")
    parser.addini("kv_redact", "hide dictionary keys in holder chains", type="bool", default=False)
    parser.addini("kv_report", "append each checked test's findings to this file (JSON lines)", default="")
    group.addoption("--kv-html", default=None, metavar="FILE",
                    help="write the checked tests as one self-contained HTML report at the end (ini: kv_html)")
    parser.addini("kv_html", "write the checked tests as one HTML report at the end", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kv_no_leak(fail_on='info', allow_bytes=0): fail the test when KV-cache memory it created outlives it "
        "(kv-guardian)",
    )
    config.pluginmanager.register(KVGuardianPlugin(config), "kvguardian-manager")


def _option(config: pytest.Config, cli: str, ini: str) -> Any:
    value = config.getoption(cli)
    return value if value is not None else config.getini(ini)


def leak_failure_text(report: Report, failing: list[Any], fail_on: Severity) -> str:
    """The text a failing ``kv_no_leak`` test shows: each finding's id, bytes and holder chain."""
    total = sum(int(f.evidence.get("bytes", 0) or 0) for f in failing)
    lines = [f"kv_no_leak: {len(failing)} finding(s) at or above {fail_on.value!r}; "
             f"{total} bytes of KV created by this test outlive it"]
    for f in failing:
        nbytes = f.evidence.get("bytes")
        lines.append(f"  {f.id} {f.name} ({f.severity.value}){f' {nbytes} bytes' if nbytes is not None else ''}: "
                     f"{f.message}")
        if f.holder_chain:
            lines.append(f"    held by: {f.render_chain()}")
        lines.append(f"    fix: {f.fix}")
    return "\n".join(lines)


class KVGuardianPlugin:
    """Hooks on one manager object; options resolved once (command line over ini)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.all = bool(_option(config, "kv_no_leak_all", "kv_no_leak_all"))
        fail_on = _option(config, "kv_fail_on", "kv_fail_on") or "info"
        try:
            self.fail_on = Severity.parse(fail_on)
        except UsageError as exc:  # an ini value: argparse's choices never saw it
            raise pytest.UsageError(f"kv_fail_on: {exc}") from None
        try:
            self.holder_seconds = float(_option(config, "kv_holder_seconds", "kv_holder_seconds"))
        except ValueError:
            self.holder_seconds = float("nan")
        if not 0 < self.holder_seconds < float("inf"):
            raise pytest.UsageError("kv_holder_seconds must be a number of seconds > 0, e.g. 3.0")
        self.redact = bool(_option(config, "kv_redact", "kv_redact"))
        self.report_path = _option(config, "kv_report", "kv_report") or None
        self.html_path = _option(config, "kv_html", "kv_html") or None
        self.checked: list[dict[str, Any]] = []  # each checked test's report, for --kv-html (bounded, see _keep)
        from kvguardian.core.report.output import check_writable

        for flag, path in (("--kv-report", self.report_path), ("--kv-html", self.html_path)):
            if path:  # one usage error at session start, not a FileNotFoundError in every test
                try:
                    check_writable(path, flag)
                except UsageError as exc:
                    raise pytest.UsageError(str(exc)) from None

    def new_guard(self) -> Any:
        from kvguardian.runtime.guard import Guard

        return Guard(strict=True, holder_search_seconds=self.holder_seconds, redact=self.redact)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        marker = item.get_closest_marker("kv_no_leak")
        if marker is None and not self.all:
            return (yield)
        fail_on, allow = self._marker_options(item, marker)
        funcargs = getattr(item, "funcargs", {})
        guard = funcargs.get("kv_guard")
        if guard is None:
            guard = self.new_guard()
        auditing = False
        try:
            guard.attach_process()
            auditing = True
        except UsageError:
            pass  # no (supported) transformers: only what the test tracks itself is audited
        try:
            result = yield
        except BaseException:
            if auditing:
                guard.detach_process()
            raise
        try:
            report = guard.check(end_implicit=True)
        finally:
            if auditing:
                guard.detach_process()
        self._write(item, report)
        failing = [f for f in report.findings if f.severity.rank >= fail_on.rank]
        orphaned = sum(int(f.evidence.get("bytes", 0) or 0) for f in failing if f.id == "KVG102")
        if failing and (orphaned > allow or any(f.id != "KVG102" for f in failing)):
            pytest.fail(leak_failure_text(report, failing, fail_on), pytrace=False)
        return result

    def _marker_options(self, item: pytest.Item, marker: pytest.Mark | None) -> tuple[Severity, int]:
        """``fail_on`` and ``allow_bytes`` of the test's marker; a bad one fails that test with one line naming
        the marker and the fix (not a traceback into kv-guardian)."""
        kwargs = dict(marker.kwargs) if marker is not None else {}
        where = f"@pytest.mark.kv_no_leak on {item.nodeid}"
        if marker is not None and marker.args:
            pytest.fail(f"{where} takes keywords only, got {marker.args!r}; fix: fail_on='warning', "
                        "allow_bytes=1024", pytrace=False)
        try:
            fail_on = Severity.parse(kwargs.pop("fail_on", self.fail_on))
        except UsageError as exc:
            pytest.fail(f"{where}: fail_on: {exc}", pytrace=False)
        allow = kwargs.pop("allow_bytes", 0)
        if isinstance(allow, bool) or not isinstance(allow, int) or allow < 0:
            pytest.fail(f"{where}: allow_bytes={allow!r} must be a whole number of bytes >= 0; fix: e.g. "
                        "allow_bytes=1024", pytrace=False)
        if kwargs:
            pytest.fail(f"{where} got unknown arguments {sorted(kwargs)}; fix: use fail_on=, allow_bytes=",
                        pytrace=False)
        return fail_on, allow

    def _write(self, item: pytest.Item, report: Report) -> None:
        if self.html_path:
            self._keep({"test": item.nodeid, **report.to_dict()})
        if not self.report_path:
            return
        with open(self.report_path, "a") as fh:
            fh.write(json.dumps({"test": item.nodeid, **report.to_dict()}, default=str) + "\n")

    def _keep(self, line: dict[str, Any]) -> None:
        """Keep a test's report for the HTML page; past `_HTML_TIMELINES` tests, only those with findings keep
        their timeline (the page draws at most that many), so a long session does not grow the plugin."""
        if len(self.checked) >= _HTML_TIMELINES and not line.get("findings"):
            line = {**line, "summary": {k: v for k, v in (line.get("summary") or {}).items() if k != "timeline"}}
        self.checked.append(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.html_path or not self.checked:
            return
        from kvguardian.core.report.document import parse_document
        from kvguardian.core.report.html import write_html

        body = "\n".join(json.dumps(line, default=str) for line in self.checked)
        doc = parse_document(body, source="pytest session", where="the session's reports")
        write_html(doc, self.html_path)
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"kv-guardian: HTML report of {len(self.checked)} checked test(s): {self.html_path}")


@pytest.fixture
def kv_guard(request: pytest.FixtureRequest) -> Generator[Any, None, None]:
    """A `kvguardian.Guard` (strict: instrumentation errors raise) for this test; detached afterwards."""
    plugin = request.config.pluginmanager.get_plugin("kvguardian-manager")
    if plugin is not None:
        guard = plugin.new_guard()
    else:  # pragma: no cover - the plugin registers itself in pytest_configure
        from kvguardian.runtime.guard import Guard

        guard = Guard(strict=True)
    yield guard
    guard.detach()
