"""``kv-guardian isolation cache-sharing``: does a server share its prefix cache between tenants? (timing probe)

Probe only systems you are authorised to test. Exit codes: 0 no sharing across tenants, 1 sharing across
tenants detected, 4 undecided within the sample cap (the numbers are printed), 2 bad input or a refused key,
3 the server is unreachable or keeps answering 429/5xx.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from typing import Any

from kvguardian.apps.cli.options import add_format, add_subcommands, example
from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK
from kvguardian.isolation.cache_sharing import ProbeOptions

NAME = "isolation"
HELP = "black-box probes of a server you are authorised to test (cache-sharing: prefix cache across tenants)"
EXAMPLE = "kv-guardian isolation cache-sharing --url http://127.0.0.1:8000 --model kvg-mini --key sk-a --key sk-b"
EXIT_UNDECIDED = 4


#: The probe's tuning options: each a `ProbeOptions` field of the same name -> its help.
_TUNING = {
    "alpha": "false 'sharing' rate (default 0.001)",
    "beta": "false 'no sharing' rate against sharing of at least --min-effect (default 0.001)",
    "min_effect": "TTFT ratio (miss/hit) of the smallest sharing a 'no sharing' verdict rules out (1.5)",
    "max_samples": "rounds per level at most (default 60)",
    "prompt_tokens": "prompt length in tokens (default 768)",
    "warmup": "discarded requests per key first (default 3)",
    "max_rps": "requests per second at most (default 10)",
    "timeout": "seconds per request (default 30)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = add_subcommands(p, "isolation", "PROBE")
    c = sub.add_parser(
        "cache-sharing", help="detect prefix-cache sharing within and across tenants from time to first token",
        description="Send random prompts as a victim (key #1) and an attacker (the same key, a key of the same "
                    "tenant, a key of another tenant); decide with an anytime-valid sequential test whether a "
                    "repeated prompt is served faster. Probe only systems you are authorised to test.",
        epilog=example(EXAMPLE))
    c.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    c.add_argument("--model", required=True, help="the model id to send requests to")
    c.add_argument("--key", action="append", default=[], metavar="KEY", required=True,
                   help="an API key: the first is the victim's, the second another tenant's (twice)")
    c.add_argument("--same-tenant-key", metavar="KEY", default=None,
                   help="a second key of the first key's tenant (tests sharing within a tenant)")
    c.add_argument("--salt-field", metavar="FIELD", default=None,
                   help="request field carrying a per-tenant cache salt (vLLM: cache_salt); the probe sends "
                        "salt a for the victim's tenant and salt b for the other")
    defaults = {f.name: f.default for f in dataclasses.fields(ProbeOptions)}
    for name, text in _TUNING.items():  # the type and default are ProbeOptions'
        c.add_argument("--" + name.replace("_", "-"), type=type(defaults[name]), default=defaults[name], help=text)
    c.add_argument("--cacert", metavar="FILE", default=None, help="CA certificate to verify an https server")
    c.add_argument("--seed", type=int, default=None, help="seed for prompts and order (default: random)")
    add_format(c, json_help="print the result as JSON")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    from kvguardian.isolation.cache_sharing import CacheSharingProbe

    if len(args.key) != 2:
        sys.stderr.write("kv-guardian isolation: error: give exactly two --key (victim, other tenant); "
                         "a second key of the victim's tenant goes in --same-tenant-key\n")
        return 2
    keys = [*args.key, *([args.same_tenant_key] if args.same_tenant_key else [])]
    opts = ProbeOptions(url=args.url, model=args.model, keys=keys, salt_field=args.salt_field, cacert=args.cacert,
                        seed=args.seed, **{name: getattr(args, name) for name in _TUNING})

    def progress(msg: str) -> None:
        if not args.quiet and args.format != "json":
            sys.stderr.write(f"  {msg}\n")

    probe = CacheSharingProbe(opts, progress=progress)
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM ends it like Ctrl-C: partial results

        def on_term(*_: object) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        result = probe.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    data = result.to_dict()
    if args.format == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif result.requests and any(lv.get("samples") for lv in data["levels"].values()):
        _print(data)  # partial results are kept; nothing to show when the first request failed
    if result.error:
        sys.stderr.write(f"kv-guardian isolation: error: {result.error}\n")
        return result.error_code
    if result.interrupted:
        sys.stderr.write("kv-guardian isolation: interrupted; the results above are partial\n")
        return 130
    across = data["shared_across_tenants"]
    if across is True:
        return EXIT_FINDINGS
    return EXIT_OK if across is False else EXIT_UNDECIDED


_WORDS = {True: "SHARED", False: "not shared", None: "undecided"}


def _print(data: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"cache-sharing probe of {data['target']} (model {data['model']}), prompts ~{data['prompt_tokens']} "
              f"tokens, alpha {data['alpha']:g}, beta {data['beta']:g}, min effect {data['min_effect']:g}x\n")
    for name, lv in data["levels"].items():
        if lv["decision"] == "not-run":
            out.write(f"  {name:<22} not run ({lv['why']})\n")
            continue
        word = "cached" if name == "caching" and lv["verdict"] else (
            "no caching" if name == "caching" and lv["verdict"] is False else _WORDS[lv["verdict"]])
        ms = lv["ttft_ms"]
        out.write(f"  {name:<22} {word:<11} p={lv['p_value']:.3g} (no-effect p={lv['p_value_effect']:.3g})  "
                  f"samples {lv['samples']}  TTFT hit/miss {ms['hit_median']} / {ms['miss_median']} ms "
                  f"(ratio {lv['ttft_ratio']})  {lv['victim']} -> {lv['attacker']}\n")
    verdict = data["shared_across_tenants"]
    out.write({True: "verdict: the prefix cache is SHARED ACROSS TENANTS (exit 1)\n",
               False: "verdict: no prefix-cache sharing across tenants at the requested error rates\n",
               None: f"verdict: undecided within {data['max_samples']} samples per level (exit 4): the server is "
                     "too noisy or the effect too small; raise --max-samples or --prompt-tokens\n"}[verdict])
    out.write(f"{data['requests']} requests in {data['seconds']:.1f} s"
              + (f", {data['throttled']} answered 429" if data["throttled"] else "") + "\n")
