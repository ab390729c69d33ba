"""Fuzzing every parser of untrusted input (issue 13, "so the next ones are found here first").

For each parser — Redis scan JSON and diff inputs, exporter report files, Prometheus text from servers,
KV-event frames, URLs — hypothesis feeds arbitrary input and mutations of valid documents, and asserts:

- the only exception is the parser's documented one (`UsageError`, `ScrapeError`, `DecodeError`);
- bounded time (hypothesis' per-example deadline);
- whatever is accepted renders (table, findings, metrics, diff) and serialises to valid JSON without raw
  control characters.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvguardian.core.errors import UsageError

EXAMPLES = int(os.environ.get("KVG_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)

# ---------------------------------------------------------------------------------------------- strategies
NASTY_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["[/oops]", "[bold red]x[/]", "\x1b[2J", "\x1b]0;t\x07", "a\nkv-guardian: all clear", "\r",
                     "\u202e", "\ud800", "NaN", "Infinity", "-1", "1e400", "", " ", "{uuid}", "redis://u:p@h"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), NASTY_TEXT)
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(NASTY_TEXT, inner, max_size=4)),
                       max_leaves=12)


def _valid_scan() -> dict:
    from kvguardian.keyspace.result import ScanResult

    result = ScanResult(target="redis://127.0.0.1:6379/0", started=1_700_000_000.0, finished=1_700_000_010.0,
                        dbsize=90, keys_scanned=90, server={"nodes": [{"addr": "127.0.0.1:6379", "role": "master"}]})
    result.patterns = [{
        "pattern": name, "placeholders": ["int"], "overflow": False, "keys": 30, "bytes": 3000, "bytes_p50": 100,
        "bytes_max": 120, "no_ttl_keys": 30, "no_ttl_bytes": 3000, "cold_keys": 30, "cold_bytes": 3000,
        "collection_keys": 10, "collection_bytes": 900, "ttl": {"none": 30}, "idle_s": {"p50": 9e5, "p90": 1e6,
                                                                                        "max": 2e6},
        "types": {"string": 30}, "top_keys": [{"key": name.replace("{int}", "7"), "bytes": 120, "type": "string",
                                               "ttl_ms": -1, "idle_s": 2e6}],
        "example_key": name.replace("{int}", "1"), "example_cold_key": name.replace("{int}", "2"),
    } for name in ("user:{int}", "[/oops]:{int}", "esc\x1b:{int}")]
    return result.to_dict()


VALID_SCAN = _valid_scan()


def _paths(doc, prefix=()):  # every (path) into a JSON document
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


SCAN_PATHS = [p for p in _paths(VALID_SCAN) if p]


@st.composite
def mutated(draw, valid: dict, paths: list):
    """A valid document with one to three values replaced (or removed) at random places."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        node = doc
        try:
            for step in path[:-1]:
                node = node[step]
            if draw(st.booleans()) and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = draw(JSONISH)
        except (KeyError, IndexError, TypeError):
            continue
    return doc


def _assert_valid_json(text: str) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    json.loads(text, parse_constant=refuse)
    assert not any(ord(c) < 32 and c not in "\n" for c in text)


def _console_text(render) -> str:  # type: ignore[no-untyped-def]
    from kvguardian.core.report.console import ConsoleReporter

    buf = io.StringIO()
    render(ConsoleReporter(buf))
    text = buf.getvalue()
    assert not any((ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u2066" for c in text)
    return text


# ---------------------------------------------------------------------------------------------- Redis scan JSON
def _use_scan(result) -> None:  # type: ignore[no-untyped-def]
    """Everything the CLI does with an accepted scan: verdicts, table, metrics, JSON, a diff against itself."""
    from prometheus_client.parser import text_string_to_metric_families

    from kvguardian.core.findings import Report
    from kvguardian.keyspace.metrics import exposition
    from kvguardian.keyspace.render import print_diff, print_scan
    from kvguardian.keyspace.verdicts import Thresholds, diff, scan_findings

    result.findings = scan_findings(result, Thresholds(min_keys=1)) + list(result.findings)
    _console_text(lambda out: print_scan(result, out))
    list(text_string_to_metric_families(exposition(result)))
    _assert_valid_json(result.to_json())
    later = copy.deepcopy(result)
    later.started += 3600
    try:
        rows, findings, warnings = diff(result, later, Thresholds(min_keys=1))
    except UsageError:
        return
    _console_text(lambda out: print_diff(rows, Report(findings=findings), warnings, out))
    from kvguardian.core.report.escape import dumps

    _assert_valid_json(dumps({"rows": rows, "warnings": warnings, **Report(findings=findings).to_dict()}))


@FUZZ
@given(mutated(VALID_SCAN, SCAN_PATHS))
def test_scan_json_mutations_parse_or_are_one_usage_error(doc):
    from kvguardian.keyspace.result import ScanResult

    try:
        result = ScanResult.from_dict(doc)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    _use_scan(result)


@FUZZ
@given(st.one_of(JSONISH, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_scan_files_of_anything_are_one_usage_error(tmp_path_factory, value):
    from kvguardian.keyspace.result import load_result

    path = tmp_path_factory.mktemp("scan") / "f.json"
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8", errors="surrogatepass")
    with pytest.raises(UsageError):
        load_result(path)


@FUZZ
@given(st.binary(max_size=300))
def test_scan_file_bytes_are_one_usage_error(tmp_path_factory, raw):
    from kvguardian.keyspace.result import load_result

    path = tmp_path_factory.mktemp("raw") / "f.json"
    path.write_bytes(raw)
    with pytest.raises(UsageError):
        load_result(path)


# ---------------------------------------------------------------------------------------------- exporter files
def _valid_report() -> str:
    from kvguardian.core.findings import Finding, Report, Severity

    return Report(findings=[Finding("KVG102", Severity.ERROR, "m", {"bytes": 4}, holder_chain=["a", "b"])],
                  created=1_700_000_000.0).to_json()


VALID_REPORT = json.loads(_valid_report())
REPORT_PATHS = [p for p in _paths(VALID_REPORT) if p]


def _check_document(text: str) -> None:
    from kvguardian.apps.cli.exporter import parse_document
    from kvguardian.core.exporters.prometheus import findings_families

    try:
        report = parse_document(text, "--report f.json")
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(report.created)
    list(findings_families(report.findings, report.created))
    _assert_valid_json(report.to_json())


@FUZZ
@given(st.one_of(mutated(VALID_REPORT, REPORT_PATHS), mutated(VALID_SCAN, SCAN_PATHS), JSONISH))
def test_exporter_report_documents_parse_or_are_one_usage_error(doc):
    _check_document(json.dumps(doc))


@FUZZ
@given(st.text(max_size=200))
def test_exporter_report_text_parses_or_is_one_usage_error(text):
    _check_document(text)


# ---------------------------------------------------------------------------------------------- Prometheus text
PROM_LINES = st.one_of(
    st.sampled_from(["# HELP vllm:kv_cache_usage_perc x", "# TYPE vllm:kv_cache_usage_perc gauge",
                     'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5', "vllm:num_requests_running 0",
                     "vllm:num_requests_waiting 0", 'vllm:cache_config_info{num_gpu_blocks="None"} 1',
                     'sglang:max_total_num_tokens{tp_rank="0"} 100', "sglang:kv_available_tokens NaN",
                     "sglang:kv_used_tokens +Inf", 'x{a="\\x1b[2J"} 1', 'x{a="[/oops]"} 1e400', "# EOF"]),
    st.text(max_size=60),
)


@FUZZ
@given(st.lists(PROM_LINES, max_size=12).map("\n".join))
def test_prometheus_text_from_servers_parses_or_is_a_scrape_error(text):
    from kvguardian.runtime.engines.board import FindingBoard
    from kvguardian.runtime.engines.promtext import ScrapeError, parse
    from kvguardian.runtime.engines.sglang_metrics import SglangConservationCheck
    from kvguardian.runtime.engines.vllm_metrics import VllmMetricsCheck

    try:
        scrape = parse(text)
    except ScrapeError:
        return
    for check in (VllmMetricsCheck(FindingBoard(), grace=0.0),
                  SglangConservationCheck(FindingBoard(), grace=0.0, tolerance=0, confirm=1)):
        for now in (0.0, 1.0):
            try:
                check.observe(scrape, now)
            except UsageError:  # "this page is not vLLM's / SGLang's metrics": documented
                break


# ---------------------------------------------------------------------------------------------- KV-event frames
@FUZZ
@given(st.lists(st.binary(max_size=24), max_size=5), st.binary(max_size=300))
def test_kv_event_frames_decode_or_are_a_decode_error(frames, payload):
    import msgpack

    from kvguardian.runtime.engines.kv_events import DecodeError, decode_batch, split_frames

    try:
        split_frames(frames)
    except DecodeError:
        pass
    for data in (payload, msgpack.packb([1.0, [["BlockStored", [payload[:8]], None, [1, 2], 16]], 0]),
                 msgpack.packb({"ts": 1, "events": [{"type": "BlockRemoved", "block_hashes": [1]}, payload]})):
        try:
            batch = decode_batch(data)
        except DecodeError:
            continue
        assert all(isinstance(e, (DecodeError, object)) for e in batch.events)


@FUZZ
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                              st.text(max_size=10), st.binary(max_size=10)),
                    lambda inner: st.one_of(st.lists(inner, max_size=6),
                                            st.dictionaries(st.one_of(st.text(max_size=8),
                                                                      st.integers(-2**63, 2**63 - 1)), inner,
                                                            max_size=6)), max_leaves=20))
def test_structured_kv_event_batches_decode_or_are_a_decode_error(obj):
    import msgpack

    from kvguardian.runtime.engines.kv_events import DecodeError, decode_batch

    for shape in (obj, [1.0, [obj], 0], [1.0, [["BlockStored", obj, obj, obj, obj, obj, obj, obj, obj]], None],
                  {"ts": 2, "events": [{"type": "BlockStored", "block_hashes": obj, "extra_keys": obj}]}):
        try:
            decode_batch(msgpack.packb(shape, use_bin_type=True))
        except DecodeError:
            pass


# ---------------------------------------------------------------------------------------------- URLs
URLISH = st.one_of(
    st.text(max_size=60),
    st.builds(lambda scheme, user, pw, host, port, path, query: f"{scheme}://{user}{pw}{host}{port}{path}{query}",
              st.sampled_from(["redis", "rediss", "unix", "http", "https", "", "ftp"]),
              st.sampled_from(["", "u", "u:", "[", "u%40x"]), st.sampled_from(["", ":S3cret!@", ":S3cret!:x@", "@"]),
              st.sampled_from(["127.0.0.1", "[::1]", "[::1", "h", "", "a b"]),
              st.sampled_from(["", ":6379", ":99999", ":-1", ":abc", ":"]),
              st.sampled_from(["", "/0", "/abc", "/0/1", "/%00"]),
              st.sampled_from(["", "?password=S3cret!", "?db=1&password=S3cret!", "?passwd", "?x=%ff"])),
)


@FUZZ
@given(URLISH)
def test_redis_urls_are_checked_in_one_usage_error_and_never_show_a_password(url):
    from kvguardian.keyspace.connect import _check_url, display_url

    shown = display_url(url)
    assert ":S3cret!@" not in shown and "password=S3cret!" not in shown
    try:
        _check_url(url)
    except UsageError as exc:
        assert ":S3cret!@" not in str(exc) and "password=S3cret!" not in str(exc) and "\n" not in str(exc)


@FUZZ
@given(URLISH)
def test_metrics_urls_are_checked_in_one_usage_error(url):
    from kvguardian.runtime.engines.promtext import check_url

    try:
        assert check_url(url) == url
    except UsageError:
        pass


@FUZZ
@given(st.lists(st.sampled_from(["python3", "python", "-E", "-I", "-S", "-X", "dev", "-c", "pass", "-m", "x",
                                 "-W", "error", "-EB", "-bE", "x.py", "--", "-", "--check-hash-based-pycs"]),
                max_size=6))
def test_run_reads_interpreter_flags_without_failing(argv):
    from kvguardian.apps.cli.run import blind_interpreter

    why = blind_interpreter(argv)
    assert why is None or why.startswith("python -")
