"""``kv-guardian serve-mini``: the OpenAI-compatible mini server (paged engine, API keys as tenants).

A target for ``kv-guardian audit cache-sharing``, ``kv-guardian run``, the exporter (``/metrics``) and the
pre-OOM guard, that needs no GPU and no download: a tiny random-weight Llama with a byte-level tokenizer.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from kvguardian._errors import EXIT_OK, UsageError, require
from kvguardian.cli.web_options import add_web_config, web_config

NAME = "serve-mini"
HELP = "serve the paged mini engine as an OpenAI-compatible server (127.0.0.1:8000) for audits and tests"

_MODES = ("off", "global", "per-salt", "per-tenant")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--model-name", default="kvg-mini", help="the model id /v1/models lists (default kvg-mini)")
    p.add_argument("--cache-mode", choices=_MODES, default="per-tenant",
                   help="prefix-cache sharing: off, global (everyone), per-salt (vLLM's cache_salt), per-tenant "
                        "(salt derived from the API key; default)")
    p.add_argument("--api-key", action="append", default=[], metavar="TENANT=KEY",
                   help="an API key and its tenant (repeatable; visible in ps: prefer --keys-file)")
    p.add_argument("--keys-file", action="append", default=[], metavar="FILE",
                   help='API keys: lines "TENANT KEY" or JSON {"KEY": "TENANT"} (repeatable)')
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks in the pool (default 2048)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--max-model-len", type=int, default=4096, help="prompt + output tokens (default 4096)")
    p.add_argument("--hidden", type=int, default=64, help="model width: the per-token prefill cost (default 64)")
    p.add_argument("--layers", type=int, default=2, help="model layers (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--scrub", choices=("never", "on-tenant-change", "always"), default="never",
                   help="zero KV blocks passed to another tenant (KV remanence; default never)")
    p.add_argument("--debug", action="store_true",
                   help="check every pool operation (KVG2xx findings on /metrics), the residue check included")
    p.add_argument("--guard", action="store_true",
                   help="feed the pool's cached blocks into a kv-guardian Guard's ledger (kvguardian_kv_* on /metrics)")
    add_web_config(p)


def run(args: argparse.Namespace) -> int:
    require("fastapi", "serve")
    require("uvicorn", "serve")
    from kvguardian.exporters.webconfig import serve_asgi
    from kvguardian.paged.openai.app import MiniConfig, create_app

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; fix: use 0-65535 (0 picks a free one)")
    web = web_config(args)
    config = MiniConfig(
        model_name=args.model_name, cache_mode=args.cache_mode, api_keys=tuple(args.api_key),
        keys_files=tuple(args.keys_file), num_blocks=args.num_blocks, block_size=args.block_size,
        max_model_len=args.max_model_len, hidden=args.hidden, layers=args.layers, threads=args.threads,
        debug=args.debug, scrub=args.scrub,
    )
    guard = None
    if args.guard:
        from kvguardian import Guard

        guard = Guard()
    app = create_app(config, web=web, guard=guard)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with serve_asgi(app, host=args.host, port=args.port, config=web, lifespan="on") as url:
        keys = len(app.state.mini.keys.tenants)
        sys.stderr.write(f"kv-guardian serve-mini: serving {url}/v1 (model {args.model_name}, cache "
                         f"{args.cache_mode}, {keys} API key(s)); Ctrl-C to stop\n")
        sys.stderr.flush()
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
    return EXIT_OK
