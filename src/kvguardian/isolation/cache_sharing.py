"""Does a server share its prefix cache between tenants? A black-box timing probe (after Gu et al., "Auditing
Prompt Caching in Language Model APIs", ICML 2025), with an anytime-valid sequential test.

Per level (``caching``, ``shared_within_tenant``, ``shared_across_tenants``) a round times the first token of
a victim's prompt repeated (hit) against the same words reordered (miss); `SequentialTest` decides after every
round. Probe only systems you are authorised to test. Prompt design and why: docs/design/isolation.md.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvguardian.core.errors import KVGuardianError, UsageError
from kvguardian.core.findings import Finding, Report, Severity
from kvguardian.isolation.client import Endpoint, ProbeError, printable
from kvguardian.isolation.sequential import SequentialTest

__all__ = ["LEVELS", "CacheSharingProbe", "ProbeOptions", "prompt_pair", "random_prompt", "random_words"]

LEVELS = ("caching", "shared_within_tenant", "shared_across_tenants")
_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"


def random_words(chars: int, rng: random.Random) -> list[str]:
    """Pseudo-words of 2-4 syllables, each with its leading space, exactly ``chars`` characters in all.

    The last word is cut to fit (never to a bare space), so any order of the words has the same length.
    """
    out: list[str] = []
    n = 0
    while n < chars:
        word = " " + "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 4)))
        word = word[:chars - n]
        if word == " " and out:
            out[-1] += rng.choice(_VOWELS)  # one character left: lengthen the previous word instead
        else:
            out.append(word)
        n += len(word)
    return out


def random_prompt(chars: int, rng: random.Random) -> str:
    """Space-separated pseudo-words of 2-4 syllables, exactly ``chars`` characters, starting with a space."""
    return "".join(random_words(chars, rng))


def prompt_pair(chars: int, rng: random.Random) -> tuple[str, str]:
    """A fresh prompt P and its miss twin Q: the same words (so the same tokenizer work), in another order
    that starts with another word (so no prefix block of Q is one of P's)."""
    words = random_words(chars, rng)
    first = words[0]
    if all(w == first for w in words):  # astronomically rare: one repeated word; Q gets fresh words
        return "".join(words), random_prompt(chars, rng)
    other = words[:]
    rng.shuffle(other)
    if other[0] == first:
        i = next(i for i, w in enumerate(other) if w != first)
        other[0], other[i] = other[i], other[0]
    return "".join(words), "".join(other)


@dataclass
class Identity:
    key: int  # index into the keys
    salt: str | None

    def describe(self, salt_names: dict[str, str]) -> str:
        return f"key #{self.key + 1}" + (f", salt {salt_names[self.salt]}" if self.salt else "")


@dataclass
class ProbeOptions:
    url: str
    model: str
    keys: list[str]  # keys[0] victim, keys[1] other tenant, keys[2] (optional) same tenant as keys[0]
    salt_field: str | None = None
    alpha: float = 1e-3
    beta: float = 1e-3
    min_effect: float = 1.5
    max_samples: int = 60
    prompt_tokens: int = 768
    warmup: int = 3
    max_rps: float = 10.0
    timeout: float = 30.0
    cacert: str | None = None
    seed: int | None = None


@dataclass
class LevelRun:
    name: str
    victim: Identity
    attacker: Identity
    test: SequentialTest
    discarded: int = 0  # rounds thrown away (429)


@dataclass
class ProbeResult:
    options: ProbeOptions
    levels: dict[str, LevelRun | None]
    salt_names: dict[str, str]
    prompt_chars: int = 0
    prompt_tokens: int | None = None
    seconds: float = 0.0
    requests: int = 0
    throttled: int = 0
    error: str | None = None
    error_code: int = 0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    def verdict(self, level: str) -> bool | None:
        run = self.levels.get(level)
        return None if run is None else run.test.verdict

    def findings(self) -> list[Finding]:
        """KVG212 when sharing across tenants was detected (so the exporter and alerts can read the JSON)."""
        run = self.levels.get("shared_across_tenants")
        if run is None or run.test.verdict is not True:
            return []
        s = run.test.summary()
        return [Finding("KVG212", Severity.ERROR,
                        f"{self.options.url}: a prompt sent with {run.victim.describe(self.salt_names)} was answered "
                        f"faster when repeated with {run.attacker.describe(self.salt_names)} (median TTFT "
                        f"{s['ttft_ms']['hit_median']} vs {s['ttft_ms']['miss_median']} ms, p = {s['p_value']:.3g}, "
                        f"{s['samples']} rounds): the prefix cache is shared across tenants",
                        evidence={"target": self.options.url, **{k: s[k] for k in ("p_value", "samples",
                                                                                    "ttft_ratio", "ttft_ms")}})]

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        levels: dict[str, Any] = {}
        for name in LEVELS:
            run = self.levels.get(name)
            if run is None:
                levels[name] = {"verdict": None, "decision": "not-run",
                                "why": "needs --same-tenant-key or --salt-field"}
                continue
            levels[name] = {**run.test.summary(), "victim": run.victim.describe(self.salt_names),
                            "attacker": run.attacker.describe(self.salt_names), "discarded_rounds": run.discarded}
        return {
            "target": o.url, "model": printable(o.model),
            **{name: levels[name]["verdict"] for name in LEVELS},
            "levels": levels,
            "alpha": o.alpha, "beta": o.beta, "min_effect": o.min_effect, "max_samples": o.max_samples,
            "salt_field": o.salt_field, "prompt_chars": self.prompt_chars, "prompt_tokens": self.prompt_tokens,
            "requests": self.requests, "throttled": self.throttled, "seconds": round(self.seconds, 3),
            "interrupted": self.interrupted, "error": self.error, "notes": self.notes,
            # a kv-guardian report too: `kv-guardian exporter --report probe.json` serves its findings
            **Report(findings=self.findings(), summary={"audit": "cache-sharing"}).to_dict(),
        }


class CacheSharingProbe:
    """Runs the probe against ``options.url``; `run` returns an `ProbeResult` (partial on error or Ctrl-C)."""

    def __init__(self, options: ProbeOptions, *, endpoint: Endpoint | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        o = options
        if len(o.keys) < 2:
            raise UsageError("isolation cache-sharing needs two API keys of different tenants: --key A --key B")
        if o.prompt_tokens < 32:
            raise UsageError(f"--prompt-tokens must be >= 32, got {o.prompt_tokens}")
        if o.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {o.warmup}")
        SequentialTest(o.alpha, o.beta, o.min_effect, o.max_samples)  # validates
        self.o = o
        self.rng = random.Random(o.seed) if o.seed is not None else random.SystemRandom()
        self.endpoint = endpoint or Endpoint(o.url, timeout=o.timeout, cacert=o.cacert, max_rps=o.max_rps)
        self.progress = progress or (lambda _msg: None)
        salt_a = salt_b = None
        self.salt_names: dict[str, str] = {}
        if o.salt_field:
            salt_a, salt_b = f"kvg-audit-{secrets.token_hex(8)}", f"kvg-audit-{secrets.token_hex(8)}"
            self.salt_names = {salt_a: "a", salt_b: "b"}
        a = Identity(0, salt_a)
        within: Identity | None = Identity(2, salt_a) if len(o.keys) > 2 else (
            Identity(1, salt_a) if o.salt_field else None)
        self.plan: dict[str, tuple[Identity, Identity] | None] = {
            "caching": (a, a),
            "shared_within_tenant": (a, within) if within is not None else None,
            "shared_across_tenants": (a, Identity(1, salt_b)),
        }

    def run(self) -> ProbeResult:
        levels: dict[str, LevelRun | None] = {
            name: None if pair is None else LevelRun(name, pair[0], pair[1], self._test())
            for name, pair in self.plan.items()
        }
        result = ProbeResult(self.o, levels, self.salt_names)
        t0 = time.monotonic()
        try:
            self._prepare(result)
            self._measure(result, [run for run in levels.values() if run is not None])
        except KeyboardInterrupt:
            result.interrupted = True
        except KVGuardianError as exc:
            result.error, result.error_code = str(exc), exc.exit_code
        finally:
            result.seconds = time.monotonic() - t0
            result.requests, result.throttled = self.endpoint.requests, self.endpoint.throttled
            self.endpoint.close()
        return result

    def _test(self) -> SequentialTest:
        o = self.o
        return SequentialTest(o.alpha, o.beta, o.min_effect, o.max_samples)

    # ------------------------------------------------------------------ steps
    def _prepare(self, result: ProbeResult) -> None:
        """Check the model is served, calibrate characters per token, warm every key up."""
        o, ep = self.o, self.endpoint
        listing = ep.request_json(0, "GET", "/v1/models", o.keys[0], who="key #1")
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise ProbeError(f"{ep.url}: GET /v1/models has no 'data' list; it is not an OpenAI-compatible API")
        models = {str(m.get("id")): m for m in data if isinstance(m, dict)}
        if o.model not in models:
            names = ", ".join(printable(n)[:64] for n in list(models)[:8]) or "none"
            raise ProbeError(f"model {printable(o.model)[:64]!r} is not served by {ep.url} (it lists: {names}); "
                             "fix: --model NAME")
        limit = models[o.model].get("max_model_len")
        probe = random_prompt(400, self.rng)
        reply = ep.request_json(0, "POST", "/v1/completions", o.keys[0],
                                self._body(probe, self.plan["caching"][0]), who="key #1")  # type: ignore[index]
        used = (reply.get("usage") or {}).get("prompt_tokens") if isinstance(reply, dict) else None
        per_token = len(probe) / used if isinstance(used, int) and used > 0 else 4.0
        if used is None:
            result.notes.append("the server reports no usage; assumed 4 characters per token")
        tokens = o.prompt_tokens
        if isinstance(limit, int) and limit > 16:
            tokens = min(tokens, limit - 8)
        result.prompt_chars = max(32, int(tokens * per_token))
        result.prompt_tokens = tokens
        self.progress(f"prompts of {result.prompt_chars} characters (~{tokens} tokens); warming up")
        for key in sorted({i.key for pair in self.plan.values() if pair for i in pair}):
            for _ in range(self.o.warmup):
                ep.stream_completion(key, o.keys[key], self._body(self._prompt(result), Identity(key, None)),
                                     who=f"key #{key + 1}")

    def _measure(self, result: ProbeResult, runs: list[LevelRun]) -> None:
        while True:
            pending = [r for r in runs if not r.test.done]
            if not pending:
                return
            self.rng.shuffle(pending)
            for run in pending:
                self._round(result, run)
            self.progress("  ".join(f"{r.name}: {r.test.samples}" for r in runs))

    def _round(self, result: ProbeResult, run: LevelRun) -> None:
        o, ep = self.o, self.endpoint
        victim, attacker = run.victim, run.attacker
        p, q = prompt_pair(result.prompt_chars, self.rng)
        if ep.stream_completion(victim.key, o.keys[victim.key], self._body(p, victim),
                                who=f"key #{victim.key + 1}") is None:
            run.discarded += 1
            return
        times: dict[str, float] = {}
        order = [("hit", p), ("miss", q)]
        self.rng.shuffle(order)
        for kind, prompt in order:
            t = ep.stream_completion(attacker.key, o.keys[attacker.key], self._body(prompt, attacker),
                                     who=f"key #{attacker.key + 1}")
            if t is None:
                run.discarded += 1
                return
            times[kind] = t.ttft
        run.test.add(times["hit"], times["miss"])

    def _prompt(self, result: ProbeResult) -> str:
        return random_prompt(result.prompt_chars, self.rng)

    def _body(self, prompt: str, who: Identity) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.o.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if self.o.salt_field and who.salt:
            body[self.o.salt_field] = who.salt
        return body
