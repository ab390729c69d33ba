"""Terminal safety (issue 13): every command that prints data from outside, fed names with markup, ESC, CR, LF
and bidi characters, prints them visibly escaped — never a raw control character, never a forged line, never
a markup crash. Real processes; the data arrives the way it would in use (files, servers, argv, exceptions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvg_hostile import HostileServer
from kvg_testing import cli_command

HOSTILE = ["[/oops]", "[bold red]m[/]", "\x1b[2J", "\x1b]0;title\x07", "a\rb", "x\nkv-guardian: all clear",
           "\u202eevil", "\u2066iso\u2069", "\x9b31m", ":smile:"]
NAME = "".join(HOSTILE)
FORGED = "kv-guardian: all clear"


def raw_control(text: str) -> list[str]:
    """Characters that move the cursor, rewrite the screen or reorder text (newlines between lines excepted)."""
    bad = {c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u2066\u2069"}
    return sorted(repr(c) for c in bad)


def assert_safe(*texts: str) -> None:
    text = "".join(texts)
    assert not raw_control(text), raw_control(text)
    assert not any(line.lstrip("│ ").startswith(FORGED) for line in text.splitlines()), "a forged line"
    assert "MarkupError" not in text and "internal error" not in text and "Traceback" not in text
    assert "😄" not in text, "emoji codes are data too"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _report_file(path: Path) -> Path:
    from kvguardian.core.findings import Finding, Report, Severity

    f = Finding("KVG102", Severity.ERROR, f"KV of {NAME} outlived its request", {"key": NAME},
                holder_chain=[f"module m: {NAME}", "dict[...]"], fix=f"drop {NAME}")
    path.write_text(Report(findings=[f], summary={"program": NAME}).to_json())
    return path


def _scan_file(path: Path, started: float) -> Path:
    from kvguardian.keyspace.result import ScanResult

    r = ScanResult(target=f"redis://127.0.0.1:6379/0?{NAME}", started=started, finished=started + 1,
                   dbsize=40, keys_scanned=40, warnings=[f"warning about {NAME}"])
    r.patterns = [{"pattern": f"{NAME}:{{int}}", "placeholders": ["int"], "overflow": False, "keys": 40 + int(started)
                   % 7, "bytes": 4000, "bytes_p50": 100, "bytes_max": 100, "no_ttl_keys": 40, "no_ttl_bytes": 4000,
                   "cold_keys": 40, "cold_bytes": 4000, "ttl": {"none": 40}, "idle_s": {"p50": 1e6, "p90": 1e6,
                                                                                        "max": 1e6},
                   "types": {"string": 40}, "top_keys": [{"key": f"{NAME}:1", "bytes": 100}],
                   "example_key": f"{NAME}:1", "example_cold_key": f"{NAME}:2"}]
    path.write_text(r.to_json())
    return path


def test_exporter_prints_hostile_findings_and_labels_safely(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    done = cli("exporter", "--once", "--report", str(_report_file(tmp_path / "r.json")))
    assert done.returncode == 0, done.stderr
    assert_safe(done.stdout, done.stderr)
    list(text_string_to_metric_families(done.stdout))


def test_exporter_error_lines_escape_a_hostile_file_name(tmp_path):
    bad = tmp_path / f"bad{HOSTILE[2]}{HOSTILE[5]}.json"
    bad.write_text("[]")
    done = cli("exporter", "--once", "--report", str(bad))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert_safe(done.stdout, done.stderr)


@pytest.mark.parametrize("json_out", [False, True])
def test_redis_diff_prints_hostile_patterns_safely(tmp_path, json_out):
    old = _scan_file(tmp_path / "old.json", 1_700_000_000.0)
    new = _scan_file(tmp_path / f"new{HOSTILE[2]}.json", 1_700_003_600.0)
    done = cli("redis", "diff", str(old), str(new), "--fail-on", "never", *(["--json"] if json_out else []))
    assert done.returncode == 0, done.stderr
    assert_safe(done.stdout, done.stderr)
    if json_out:
        assert json.loads(done.stdout)["rows"][0]["pattern"] == f"{NAME}:{{int}}"
    else:
        assert "[/oops][bold red]m[/]\\x1b[2J" in done.stdout


def test_run_prints_a_hostile_program_name_and_keeps_the_exit_code(tmp_path):
    script = tmp_path / f"{HOSTILE[2]}{HOSTILE[5]}{HOSTILE[6]}.py"
    script.write_text("import sys\nsys.exit(4)\n")
    done = cli("run", "--", sys.executable, str(script), *HOSTILE)
    assert done.returncode == 4, done.stderr
    assert "\\x1b[2Jx\\nkv-guardian: all clear" in done.stderr
    assert_safe(done.stderr)


def test_sweep_prints_a_hostile_exception_of_the_callable_safely(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "hostile_attn.py").write_text(
        "import torch.nn.functional as F\n"
        f"MSG = {NAME!r}\n"
        "def attn(q, k, v, is_causal=False):\n"
        "    if q.shape[2] == 3:\n"
        "        raise RuntimeError(MSG)\n"
        "    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)\n")
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = cli("sweep", "--attn", "hostile_attn:attn", "--lengths", "1-4", "--heads", "1", "--head-dim", "8",
               "--repeats", "1", "--show", "all", env=env)
    assert done.returncode == 1, done.stderr
    assert "ERROR" in done.stdout and "RuntimeError: [/oops][bold red]m[/]\\x1b[2J" in done.stdout
    assert_safe(done.stdout, done.stderr)


@pytest.mark.parametrize("args", [
    ("redis", "scan", f"redis://127.0.0.1:1/0?x={NAME}", "--timeout", "1"),
    ("redis", "scan", f"redis://{NAME}:6379/0", "--timeout", "1"),
    ("watch", "sglang", "--metrics", f"http://127.0.0.1:1/{NAME}", "--duration", "0.3"),
    ("repro", "orphaned", "--requests", NAME),
    ("redis", "diff", f"/nonexistent/{NAME}.json", "x"),
])
def test_error_lines_escape_hostile_arguments(args):
    done = cli(*args, timeout=60)
    assert done.returncode in (2, 3), done.stderr
    assert_safe(done.stdout, done.stderr)


def test_watch_prints_hostile_labels_from_a_server_safely():
    label = NAME.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # the text format's escapes
    page = "".join(f'{name}{{model_name="{label}"}} {v}\n' for name, v in (
        ("sglang:max_total_num_tokens", 100), ("sglang:kv_available_tokens", 10), ("sglang:kv_evictable_tokens", 0),
        ("sglang:kv_used_tokens", 95), ("sglang:num_used_tokens", 95), ("sglang:num_running_reqs", 0),
        ("sglang:num_queue_reqs", 0))).encode()
    with HostileServer("metrics", body=page) as server:
        done = cli("watch", "sglang", "--metrics", server.url, "--interval", "0.1", "--grace", "0", "--confirm",
                   "1", "--duration", "1.2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "KVG206" in done.stdout and "[/oops][bold red]m[/]\\x1b[2J" in done.stdout
    assert_safe(done.stdout, done.stderr)


def test_lint_prints_hostile_file_names_and_source_safely(tmp_path):
    src = tmp_path / f"a{HOSTILE[2]}{HOSTILE[5]}.py"
    src.write_text("import time\nimport redis\nr = redis.Redis()\n\n\ndef f(x):\n"
                   f"    r.set(f'tmp:{json.dumps(NAME)[1:-1]}{{time.time()}}', x)\n")
    done = cli("lint", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "KVG405" in done.stdout
    assert_safe(done.stdout, done.stderr)
