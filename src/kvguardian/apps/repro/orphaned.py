"""Orphaned KV: a chat server keeps every request's cache "for follow-ups" that never come.

The buggy server stores each request's cache in a session dict on a module-level server object. The guard
must name the holder chain from that global to the KV (KVG102) and flag the growth across requests (KVG103).
The fixed server keeps a bounded LRU of sessions and declares it with ``guard.retain``: no warning, no error.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro import DemoRow, ReproResult
from kvguardian.apps.repro.models import TINY, build_llama
from kvguardian.core.errors import UsageError
from kvguardian.core.report.reporter import Reporter

if TYPE_CHECKING:
    from transformers import Cache, LlamaForCausalLM

    from kvguardian.runtime.guard import Guard

NAME = "orphaned"
SECTION = ""
TITLE = "session store keeps every request's KV (orphaned KV, holder chain, growth)"

DEFAULT_REQUESTS = 24
MAX_SESSIONS = 4

#: The running server, as a real application would keep it: a module global.
SERVER: Any = None


class SessionStore:
    """Follow-up sessions: request id -> cache. ``limit=None`` is the bug (unbounded)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.entries: OrderedDict[str, Any] = OrderedDict()

    def put(self, request_id: str, cache: Cache) -> None:
        self.entries[request_id] = cache
        self.entries.move_to_end(request_id)
        while self.limit is not None and len(self.entries) > self.limit:
            self.entries.popitem(last=False)


class ChatServer:
    def __init__(self, model: LlamaForCausalLM, guard: Guard, *, fixed: bool) -> None:
        self.model = model
        self.guard = guard
        self.sessions = SessionStore(MAX_SESSIONS if fixed else None)
        if fixed:
            guard.retain(self.sessions, reason=f"follow-up sessions, LRU of {MAX_SESSIONS}")

    def handle(self, request_id: str, tenant: str, prompt: Any) -> Any:
        from kvguardian.runtime.hf.compat import output_cache

        with self.guard.request(request_id, tenant=tenant):
            out = self.model.generate(
                prompt, max_new_tokens=8, do_sample=False, return_dict_in_generate=True
            )
            self.sessions.put(request_id, output_cache(out))
            return out.sequences


def first_growth_flag(series: list[float]) -> int | None:
    """The request count at which the trend test first fires on the growing series (None: never)."""
    from kvguardian.core.detectors.growth import trend_test

    for n in range(2, len(series) + 1):
        if trend_test(series[:n]).growing:
            return n
    return None


def measure(requests: int) -> dict[str, Any]:
    import torch

    from kvguardian.runtime.guard import Guard

    global SERVER
    model = build_llama(TINY)
    gen = torch.Generator().manual_seed(3)
    results: dict[str, Any] = {}
    for variant in ("buggy", "fixed"):
        guard = Guard()
        guard.attach(model)
        t0 = time.perf_counter()
        try:
            SERVER = ChatServer(model, guard, fixed=(variant == "fixed"))
            for i in range(requests):
                length = int(torch.randint(6, 24, (1,), generator=gen))
                prompt = torch.randint(0, model.config.vocab_size, (1, length), generator=gen)
                SERVER.handle(f"r-{i}", "acme" if i % 2 else "globex", prompt)
            report = guard.check()
            series = [float(b) for (_, _, b) in guard.snapshot().retained_series]
        finally:
            guard.detach()
            SERVER = None
        orphans = report.by_id("KVG102")
        results[variant] = {
            "requests": requests,
            "findings": {k: len(report.by_id(k)) for k in sorted(report.ids())},
            "orphaned_bytes": sum(f.evidence.get("bytes", 0) for f in orphans),
            "holder_chain": orphans[0].holder_chain if orphans else None,
            "growth_flagged_after": first_growth_flag(series),
            "growth_message": report.by_id("KVG103")[0].message if report.by_id("KVG103") else None,
            "retained_bytes_last": series[-1] if series else 0.0,
            "summary": report.summary,
            "worst": worst.value if (worst := report.worst()) is not None else None,
            "seconds": time.perf_counter() - t0,
        }
    buggy, fixed = results["buggy"], results["fixed"]
    chain = buggy["holder_chain"] or []
    ok = (
        buggy["findings"].get("KVG102", 0) == requests
        and bool(chain) and chain[0].startswith(f"module {__name__}: SERVER")
        and buggy["findings"].get("KVG103", 0) == 1
        and fixed["worst"] in (None, "info")
    )
    return {"model": TINY.describe(), "variants": results, "ok": ok}


def render(data: dict[str, Any], out: Reporter) -> None:
    b, f = data["variants"]["buggy"], data["variants"]["fixed"]
    out.text(f"model: {data['model']}")
    out.text("")
    out.text(f"buggy: {b['requests']} requests → findings {b['findings']}, {b['orphaned_bytes']} bytes orphaned")
    if b["holder_chain"]:
        out.text("  holder chain: " + " → ".join(b["holder_chain"]))
    out.text(f"  growth flagged after {b['growth_flagged_after']} requests: {b['growth_message']}")
    out.text(f"fixed: {f['requests']} requests → findings {f['findings'] or 'none'} "
             f"(bounded LRU of {MAX_SESSIONS}, declared with guard.retain)")
    out.text(f"verdict: {'as expected' if data['ok'] else 'NOT as expected'}", tone="strong")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests per variant (default: %(default)s)")


def run(args: argparse.Namespace) -> ReproResult:
    if not 16 <= args.requests <= 10_000:
        raise UsageError(f"--requests {args.requests} is out of range; fix: use 16..10000 (growth needs 16)")
    data = measure(args.requests)
    return ReproResult(NAME, SECTION, TITLE, data, render, ok=data["ok"])


def demo_row() -> DemoRow:
    data = measure(DEFAULT_REQUESTS)
    b, f = data["variants"]["buggy"], data["variants"]["fixed"]
    chain = b["holder_chain"] or ["(no chain)"]
    short_chain = " → ".join(chain[:3]) + (" → …" if len(chain) > 3 else "")
    return DemoRow(
        name=NAME,
        section="ours",
        article_claim="(chapter 1: caches that only ever grow; GC-unreachable KV)",
        measured=f"{b['orphaned_bytes']:,} bytes orphaned over {b['requests']} requests",
        verdict=(
            f"KVG102 ×{b['findings'].get('KVG102', 0)} held by {short_chain}; KVG103 after "
            f"{b['growth_flagged_after']} requests; fixed variant: {f['worst'] or 'silent'}"
        ),
        fix_verified=f["worst"] in (None, "info"),
        ok=data["ok"],
        details={"holder_chain": chain},
    )
