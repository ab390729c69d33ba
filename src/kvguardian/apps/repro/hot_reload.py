"""§2.5 — hot reload leaves the old model generation's KV alive.

A real FastAPI + uvicorn server (`kvguardian.apps.repro.reload_server`) is driven over HTTP through traffic
and ``/reload``s. Buggy: an ``lru_cache`` on a method keeps every old service and its prefix KV alive (KV grows
with reloads; the guard reports KVG105 with the holder chain). Fixed: the prefix store dies with its service.
The article's Ray KV API does not exist; why, and the Ray Serve equivalent: docs/design/repro.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvguardian.apps.repro import DemoRow, ReproResult, verdict_line
from kvguardian.core.errors import UsageError
from kvguardian.core.report.reporter import Reporter

NAME = "hot-reload"
SECTION = "§2.5"
TITLE = "hot reload keeps the old model generation's KV alive (FastAPI + uvicorn over HTTP)"

SYSTEMS = ("You are a helpful assistant.", "Translate to French, briefly.")
DEFAULT_RELOADS = 20
DEMO_RELOADS = 5


def _fit(ys: list[float]) -> tuple[float, float]:
    """Least-squares slope per step and R² of ``ys`` against 0..n-1 (R² is 1.0 for a flat series)."""
    import numpy as np

    x = np.arange(len(ys), dtype=float)
    y = np.asarray(ys, dtype=float)
    if len(ys) < 2:
        return 0.0, 1.0
    slope, icpt = np.polyfit(x, y, 1)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - (slope * x + icpt)) ** 2).sum())
    return float(slope), (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


def drive(variant: str, *, reloads: int, requests_per_reload: int) -> dict[str, Any]:
    """Start the server, drive it over HTTP, return what was measured."""
    import httpx

    from kvguardian.apps.repro.reload_server import create_app, serve

    t0 = time.perf_counter()
    app = create_app(variant)
    series: list[dict[str, Any]] = []
    n_req = 0
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as client:

        def traffic() -> None:
            nonlocal n_req
            for _ in range(requests_per_reload):
                body = {"system": SYSTEMS[n_req % len(SYSTEMS)], "prompt": f"question number {n_req}",
                        "max_new_tokens": 4}
                client.post("/generate", json=body).raise_for_status()
                n_req += 1

        # KV bytes without a gc pass: what reference counting alone frees (the fix needs no gc; /check settles)
        traffic()
        series.append(client.get("/kv", params={"settle": "false"}).json())
        for i in range(reloads):
            client.post("/reload", json={"seed": i + 1}).raise_for_status()
            traffic()
            series.append(client.get("/kv", params={"settle": "false"}).json())
        report = client.get("/check").json()
        bad = client.post("/generate", json={"system": "", "prompt": "x"}).status_code
    kv = [s["kv_bytes"] for s in series]
    slope, r2 = _fit([float(b) for b in kv])
    stale = [f for f in report["findings"] if f["id"] == "KVG105"]
    return {
        "variant": variant,
        "url": url,
        "reloads": reloads,
        "requests": n_req,
        "kv_bytes_after_each_reload": kv,
        "models_alive_end": series[-1]["models_alive"],
        "generations_with_kv_end": len(series[-1]["kv_bytes_by_generation"]),
        "slope_bytes_per_reload": slope,
        "r2": r2,
        "findings": {fid: sum(1 for f in report["findings"] if f["id"] == fid)
                     for fid in sorted({f["id"] for f in report["findings"]})},
        "kvg105_first": stale[0] if stale else None,
        "stale_bytes": sum(f["evidence"]["bytes"] for f in stale),
        "bad_request_status": bad,
        "seconds": time.perf_counter() - t0,
    }


def measure(*, reloads: int, requests_per_reload: int) -> dict[str, Any]:
    from kvguardian.apps.repro.threads import torch_threads

    t0 = time.perf_counter()
    with torch_threads(1):
        buggy = drive("buggy", reloads=reloads, requests_per_reload=requests_per_reload)
        fixed = drive("fixed", reloads=reloads, requests_per_reload=requests_per_reload)
    per_reload = buggy["kv_bytes_after_each_reload"][1] - buggy["kv_bytes_after_each_reload"][0]
    first = buggy["kvg105_first"] or {}
    chain = first.get("holder_chain") or []
    fkv = fixed["kv_bytes_after_each_reload"]
    ok = (
        buggy["findings"].get("KVG105", 0) == reloads
        and buggy["r2"] > 0.99 and buggy["slope_bytes_per_reload"] > 0
        and buggy["models_alive_end"] == reloads + 1
        and bool(chain) and chain[0].startswith("class kvguardian.apps.repro.reload_server.LruPrefixService")
        and max(fkv) == min(fkv) and fixed["models_alive_end"] == 1
        and not fixed["findings"].get("KVG105") and not fixed["findings"].get("KVG102")
        and buggy["bad_request_status"] == 422
    )
    return {
        "buggy": buggy,
        "fixed": fixed,
        "kv_bytes_per_reload_first": per_reload,
        "ray_get_kv_exists": False,
        "ok": ok,
        "seconds": time.perf_counter() - t0,
    }


def render(data: dict[str, Any], out: Reporter) -> None:
    b, f = data["buggy"], data["fixed"]
    first = b["kvg105_first"] or {}
    out.text(f"server: FastAPI + uvicorn on 127.0.0.1 (tiny random-weight Llama), {b['reloads']} reloads, "
             f"{b['requests']} /generate requests over HTTP per variant")
    out.text("")
    out.text("buggy (functools.lru_cache on the prefix method): KV bytes after each reload "
             f"{b['kv_bytes_after_each_reload']}")
    out.text(f"  slope {b['slope_bytes_per_reload']:,.0f} bytes/reload, R² {b['r2']:.4f}; models alive at the end: "
             f"{b['models_alive_end']}; generations with live KV: {b['generations_with_kv_end']}")
    out.text(f"  guard: {b['findings']}; {b['stale_bytes']:,} bytes of stale-generation KV")
    if first:
        out.text(f"  e.g. {first['message']}")
        if first.get("holder_chain"):
            out.text("  held by: " + " → ".join(first["holder_chain"]))
    out.text(f"fixed (prefix store on the instance): KV bytes after each reload {f['kv_bytes_after_each_reload']}")
    out.text(f"  slope {f['slope_bytes_per_reload']:,.0f} bytes/reload; models alive at the end: "
             f"{f['models_alive_end']}; guard: {f['findings'] or 'no findings'}")
    out.text("")
    out.text("article: the leak goes through Ray's ray.get_runtime_context().get_kv(): that API does not exist in Ray "
             "(RuntimeContext has id, resource, namespace and runtime-env getters, no KV accessor). The same check "
             "runs inside a Ray Serve replica: attach a Guard in __init__, call guard.new_generation() in "
             "reconfigure(), and read guard.check() from a replica method (docs/claims.md, 'Hot reload').")
    verdict_line(out, f"growth linear in reloads and KVG105 per stale generation (buggy); flat and silent (fixed): "
                 f"{data['ok']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reloads", type=int, default=DEFAULT_RELOADS, help="reloads per variant (default: %(default)s)")
    p.add_argument("--requests", type=int, default=2, help="/generate requests after each reload (default: 2)")


def run(args: argparse.Namespace) -> ReproResult:
    if not 2 <= args.reloads <= 500 or not 1 <= args.requests <= 100:
        raise UsageError("--reloads must be 2..500 and --requests 1..100; fix: e.g. --reloads 20 --requests 2")
    data = measure(reloads=args.reloads, requests_per_reload=args.requests)
    return ReproResult(NAME, SECTION, TITLE, data, render, ok=data["ok"])


def demo_row() -> DemoRow:
    data = measure(reloads=DEMO_RELOADS, requests_per_reload=2)
    b, f = data["buggy"], data["fixed"]
    first = b["kvg105_first"] or {}
    chain = first.get("holder_chain") or ["(no chain)"]
    measured = (
        f"HTTP, {b['reloads']} reloads: buggy KV {b['kv_bytes_after_each_reload'][0]:,}→"
        f"{b['kv_bytes_after_each_reload'][-1]:,} B (+{b['slope_bytes_per_reload']:,.0f} B/reload, R² "
        f"{b['r2']:.3f}; {b['models_alive_end']} models alive); fixed flat at "
        f"{f['kv_bytes_after_each_reload'][-1]:,} B; Ray's get_kv() does not exist"
    )
    verdict = (
        f"KVG105 ×{b['findings'].get('KVG105', 0)} held by {' → '.join(chain[:2])} …; "
        f"fixed: {'silent' if not f['findings'] else f['findings']}"
    )
    return DemoRow(
        name=NAME,
        section=SECTION,
        article_claim="hot reload (FastAPI + Ray) leaves KV handles dangling; Ray get_kv() ref count 2 instead of 0",
        measured=measured,
        verdict=verdict,
        fix_verified=not f["findings"] and len(set(f["kv_bytes_after_each_reload"])) == 1,
        ok=data["ok"],
        details={"kv_bytes": {"buggy": b["kv_bytes_after_each_reload"], "fixed": f["kv_bytes_after_each_reload"]}},
    )
