"""Redis key-space leak analysis (the article's chapter 1): read-only scans, key-pattern mining, per-pattern
statistics, leak verdicts (KVG301–KVG305), scan diffs, and a Prometheus exporter.

Modules: `connect` (URLs, server facts, Cluster masters), `probe` (read-only Lua / pipeline per batch),
`tokens` and `patterns` (mining), `stats` (per-pattern accumulators), `scan` (the loop), `result` (the JSON
schema), `verdicts`, `redact`, `render`, `metrics`, `exporter`. Needs ``pip install 'kv-guardian[redis]'``;
nothing here imports torch.
"""

from __future__ import annotations

__all__: list[str] = []
