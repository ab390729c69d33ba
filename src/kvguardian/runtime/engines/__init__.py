"""Watchers for inference servers kv-guardian cannot hook into: vLLM and SGLang, checked from the outside.

- `promtext`, `vllm_metrics`, `sglang_metrics`: scrape Prometheus text; idle KV usage, reloads, token
  conservation (KVG206, KVG207);
- `kv_events`, `kv_subscriber`, `prefix_audit`: vLLM's KV events over ZMQ and the index they describe
  (KVG105, KVG208, KVG209);
- `board`, `watch`: a watch's findings and loop; `vllm_plugin`: the in-process audit inside vLLM.

Extras ``prometheus`` and ``zmq`` are imported when used. Details: docs/design/engines.md.
"""

from __future__ import annotations

__all__: list[str] = []
