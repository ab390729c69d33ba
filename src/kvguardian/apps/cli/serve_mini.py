"""``kv-guardian serve-mini``: the OpenAI-compatible mini server (paged engine, API keys as tenants).

A target for ``kv-guardian isolation cache-sharing``, ``kv-guardian run``, the exporter (``/metrics``) and the
pre-OOM guard, that needs no GPU and no download: a tiny random-weight Llama with a byte-level tokenizer.

With ``--oom`` the server runs the in-process pre-OOM guard (`kvguardian.ops.oom`): this process's memory cgroup
(when it has a limit), the pool's occupancy and, with a KV budget (``--kv-budget-mb``, ``KVG_KV_BUDGET_MB``
or ``NV_GPU_KV_CACHE_MB``), the ledger's KV bytes are its signals; ``/ready``, ``/drain`` and ``/oom`` are
served, new requests get 503 + Retry-After while it drains, and ``/metrics`` carries ``kvguardian_oom_*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from typing import Any

from kvguardian.apps.cli.web_options import add_web_config, web_config
from kvguardian.apps.mini_server.config import MiniConfig
from kvguardian.apps.mini_server.tenancy import CACHE_MODES
from kvguardian.core.errors import EXIT_OK, UsageError, require

NAME = "serve-mini"
HELP = "serve the paged mini engine as an OpenAI-compatible server (127.0.0.1:8000) for probes and tests"
EXAMPLE = "kv-guardian serve-mini --cache-mode per-tenant --api-key acme=sk-a --api-key globex=sk-b"

#: The pool's and the model's sizes: each a `MiniConfig` field of the same name -> its help.
_SIZES = {
    "num_blocks": "KV blocks in the pool (default 2048)",
    "block_size": "tokens per block (default 16)",
    "max_model_len": "prompt + output tokens (default 4096)",
    "hidden": "model width: the per-token prefill cost (default 64)",
    "layers": "model layers (default 2)",
    "threads": "torch threads (default 1)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--model-name", default="kvg-mini", help="the model id /v1/models lists (default kvg-mini)")
    p.add_argument("--cache-mode", choices=CACHE_MODES, default="per-tenant",
                   help="prefix-cache sharing: off, global (everyone), per-salt (vLLM's cache_salt), per-tenant "
                        "(salt derived from the API key; default)")
    p.add_argument("--api-key", action="append", default=[], metavar="TENANT=KEY",
                   help="an API key and its tenant (repeatable; visible in ps: prefer --keys-file)")
    p.add_argument("--keys-file", action="append", default=[], metavar="FILE",
                   help='API keys: lines "TENANT KEY" or JSON {"KEY": "TENANT"} (repeatable)')
    defaults = {f.name: f.default for f in dataclasses.fields(MiniConfig)}
    for name, text in _SIZES.items():  # the type and default are MiniConfig's
        p.add_argument("--" + name.replace("_", "-"), type=type(defaults[name]), default=defaults[name], help=text)
    p.add_argument("--scrub", choices=("never", "on-tenant-change", "always"), default="never",
                   help="zero KV blocks passed to another tenant (KV remanence; default never)")
    p.add_argument("--debug", action="store_true",
                   help="check every pool operation (KVG2xx findings on /metrics), the residue check included")
    p.add_argument("--guard", action="store_true",
                   help="feed the pool's cached blocks into a kv-guardian Guard's ledger (kvguardian_kv_* on /metrics)")
    oom = p.add_argument_group("pre-OOM guard (in process)")
    oom.add_argument("--oom", action="store_true",
                     help="guard the server: evict the prefix cache, then drain (/ready false, 503 + Retry-After) "
                          "before the memory limit; serves /ready, /drain and /oom")
    oom.add_argument("--oom-evict", type=float, default=0.92, metavar="RATIO", help="evict watermark (default 0.92)")
    oom.add_argument("--oom-drain", type=float, default=0.97, metavar="RATIO", help="drain watermark (default 0.97)")
    oom.add_argument("--oom-shed", type=float, default=0.99, metavar="RATIO",
                     help="shed watermark: while draining, end the newest requests (default 0.99)")
    oom.add_argument("--oom-interval", type=float, default=0.05, metavar="S",
                     help="seconds between samples (default 0.05; every pool allocation samples too)")
    oom.add_argument("--oom-preempt", action="store_true",
                     help="preempt the newest running request (recomputed later) as the last eviction step")
    oom.add_argument("--kv-budget-mb", type=int, metavar="MB",
                     help="the pod's KV budget (default: KVG_KV_BUDGET_MB or NV_GPU_KV_CACHE_MB); implies --guard")
    add_web_config(p)


_OOM_OPTIONS = {"oom_evict": 0.92, "oom_drain": 0.97, "oom_shed": 0.99, "oom_interval": 0.05, "oom_preempt": False,
                "kv_budget_mb": None}


def _guards(args: argparse.Namespace) -> tuple[Any, Any]:
    """The `kvguardian.Guard` (``--guard``, or a KV budget to count against) and the `OOMGuard` (``--oom``)
    the arguments ask for, each None when not asked for.

    Raises:
        UsageError: an ``--oom-*`` option without ``--oom``, watermarks out of order, a bad KV budget.
    """
    from kvguardian.ops.oom.budget import kv_budget

    if not args.oom:
        for name, default in _OOM_OPTIONS.items():
            if getattr(args, name) != default:
                raise UsageError(f"--{name.replace('_', '-')} configures the pre-OOM guard; fix: add --oom")
    budget = kv_budget(args.kv_budget_mb) if args.oom else None
    guard = None
    if args.guard or budget is not None:
        from kvguardian import Guard

        guard = Guard()
    if not args.oom:
        return guard, None
    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.ops.oom.policy import Watermarks

    wm = Watermarks(evict=args.oom_evict, drain=args.oom_drain, shed=args.oom_shed)
    return guard, OOMGuard.for_process(guard, budget_mb=args.kv_budget_mb, watermarks=wm, interval=args.oom_interval)


def run(args: argparse.Namespace) -> int:
    require("fastapi", "serve")
    require("uvicorn", "serve")
    from kvguardian.apps.mini_server.app import create_app
    from kvguardian.core.exporters.webconfig import serve_asgi

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    web = web_config(args)
    config = MiniConfig(
        model_name=args.model_name, cache_mode=args.cache_mode, api_keys=tuple(args.api_key),
        keys_files=tuple(args.keys_file), debug=args.debug, scrub=args.scrub,
        **{name: getattr(args, name) for name in _SIZES},
    )
    guard, oom = _guards(args)
    app = create_app(config, web=web, guard=guard, oom=oom, oom_preempt=args.oom_preempt)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with serve_asgi(app, host=args.host, port=args.port, config=web, lifespan="on") as url:
        keys = len(app.state.mini.keys.tenants)
        guarded = f"; pre-OOM guard on {', '.join(s.name for s in oom.signals)}" if oom is not None else ""
        sys.stderr.write(f"kv-guardian serve-mini: serving {url}/v1 (model {args.model_name}, cache "
                         f"{args.cache_mode}, {keys} API key(s){guarded}); Ctrl-C to stop\n")
        sys.stderr.flush()
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
    return EXIT_OK
