"""``redis scan --html`` and ``redis diff --html`` on a real Redis: the page is the result, drawn (treemap of the
patterns, their TTL and idle-time histograms, growth per pattern), with the command's tables after it."""

from __future__ import annotations

import html as html_lib
import json
import re

import pytest
from kvg_redis import seed

pytestmark = pytest.mark.services


def _tiles(html: str) -> set[str]:
    return {html_lib.unescape(p) for p in re.findall(r'class="tile-g" data-pattern="([^"]*)"', html)}


def test_scan_and_diff_write_html(redis_proc, kv_cli, tmp_path):
    r = redis_proc.client()
    seed(r)
    r.set("evil:<script>alert(1)</script>", "x")
    old, page = tmp_path / "old.json", tmp_path / "scan.html"
    rc, out, err = kv_cli("redis", "scan", redis_proc.url, "-o", str(old), "--html", str(page), "--fail-on", "never")
    assert rc == 0, err
    scan = json.loads(old.read_text())
    html = page.read_text()
    assert _tiles(html) >= {p["pattern"] for p in scan["patterns"][:20] if p["bytes"] > 0}
    assert f'data-total="{len(scan["findings"])}"' in html
    assert "idle time since the last read" in html and "Command output" in html  # the scan's own tables too
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html
    assert "patterns" in out  # the terminal output is unchanged
    r.set("tmp_1712345678000000001", "y" * 200)
    for i in range(300):
        r.set(f"tmp_{1_712_345_678_000_000_000 + i * 7919}", "t" * 20)
    new = tmp_path / "new.json"
    rc, _, err = kv_cli("redis", "scan", redis_proc.url, "-o", str(new), "--fail-on", "never", "--json")
    assert rc == 0, err
    diff_page = tmp_path / "diff.html"
    rc, out, err = kv_cli("redis", "diff", str(old), str(new), "--json", "--html", str(diff_page))
    assert rc == 0, err
    assert json.loads(out)["rows"]  # --json still prints the document
    html = diff_page.read_text()
    assert 'data-pattern="tmp_{ts_ns}"' in html and 'class="growth"' in html


def test_a_bad_html_path_fails_before_the_scan(redis_proc, kv_cli, tmp_path):
    rc, _out, err = kv_cli("redis", "scan", redis_proc.url, "--html", str(tmp_path / "no" / "x.html"))
    assert rc == 2 and "--html" in err and err.count("\n") == 1
