"""The pre-OOM guard (article §4.4): evict at 92 %, drain at 97 %, never let the kernel's OOM killer in.

- `signals`: read-only memory signals (cgroup v1/v2, CUDA, NVML, a paged pool, the ledger vs a KV budget);
- `policy`: watermarks with hysteresis; `actions`: what eviction, preemption and shedding do;
- `guard`: `OOMGuard`, which samples (a thread, and every allocation path) and acts;
- `asgi`: middleware with ``/ready`` and ``/drain`` for FastAPI / Starlette / any ASGI server;
- `engine`: the paged mini engine wired to a guard; `hf_cache`: a bounded HF prefix cache that evicts;
- `sidecar`: ``kv-guardian oom-guard`` for servers we cannot hook (vLLM, SGLang): readiness and drain only.

``import kvguardian.ops.oom`` imports neither torch nor prometheus_client.
"""

from __future__ import annotations

from kvguardian.ops.oom.budget import kv_budget
from kvguardian.ops.oom.guard import OOMGuard, Overloaded
from kvguardian.ops.oom.policy import Watermarks

__all__ = ["OOMGuard", "Overloaded", "Watermarks", "kv_budget"]
