"""Size of the HTML report and the time Chromium takes to open it: writes bench/results/html_report.json.

Reports of 1,000 and 100,000 requests, every 10th leaving its KV behind (a KVG102 finding with a holder chain
each: 10,000 findings for the larger), the timeline buffer at its fixed capacity, and - the worst case for the
renderer - every request listed in the timeline (the ledger itself keeps at most 4,096) are rendered with
``kv-guardian report``'s renderer; each is opened from file:// in Debian's Chromium (headless, through
Playwright) in a fresh tab, ``--rounds`` times interleaved with an anchor (a one-line HTML file) opened the same
way. "open" is the navigation's load-event end plus one animation frame (the page is laid out and painted).
Targets (issue 16): <= 2 MB for 1,000 requests, and for 100,000 (decimated) <= 2 MB and opening in < 3 s.

    nice .venv/bin/python bench/html_report.py [--rounds 5] [--out bench/results/html_report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the report builder the tests use

from kvg_browser import CHROMIUM, FLAGS
from kvg_reports import synthetic_report
from kvguardian.core.report.document import load_document
from kvguardian.core.report.html import write_html

SIZES = ((1_000, 10), (100_000, 10))
OPEN_JS = """async () => { await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const nav = performance.getEntriesByType('navigation')[0]; return nav.loadEventEnd; }"""


def _render(folder: Path, n: int, leak_every: int) -> dict:
    data = synthetic_report(n, leak_every=leak_every, max_lanes=n)
    src = folder / f"report-{n}.json"
    src.write_text(json.dumps(data))
    t0 = time.process_time()
    doc = load_document(src)
    out = folder / f"report-{n}.html"
    size = write_html(doc, out)
    return {"requests": n, "findings": len(doc.findings), "json_bytes": src.stat().st_size, "html_bytes": size,
            "render_cpu_s": round(time.process_time() - t0, 3), "path": out}


def _open_ms(browser, path: Path) -> float:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.evaluate(OPEN_JS)
        return (time.perf_counter() - t0) * 1000
    finally:
        ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/html_report.json")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reports = [_render(folder, n, every) for n, every in SIZES]
        anchor = folder / "anchor.html"
        anchor.write_text("<!DOCTYPE html><title>anchor</title><p>anchor</p>")
        times: dict[str, list[float]] = {str(r["requests"]): [] for r in reports} | {"anchor": []}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            try:
                for _ in range(args.rounds):  # interleaved: the anchor, then each report, every round
                    times["anchor"].append(_open_ms(browser, anchor))
                    for r in reports:
                        times[str(r["requests"])].append(_open_ms(browser, r["path"]))
            finally:
                browser.close()
    anchor_ms = statistics.median(times["anchor"])
    out = {
        "benchmark": "html_report",
        "rounds": args.rounds,
        "anchor_open_ms_median": round(anchor_ms, 1),
        "reports": [{**{k: v for k, v in r.items() if k != "path"},
                     "open_ms_median": round(statistics.median(times[str(r["requests"])]), 1),
                     "open_ms_all": [round(t, 1) for t in times[str(r["requests"])]],
                     "open_over_anchor": round(statistics.median(times[str(r["requests"])]) / anchor_ms, 2)}
                    for r in reports],
        "target_html_bytes_max": 2_000_000,
        "target_open_ms_max_100k": 3000,
        "chromium": CHROMIUM,
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
    }
    write_json(args.out, out)


if __name__ == "__main__":
    main()
