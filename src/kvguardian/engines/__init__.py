"""Watchers for inference servers kv-guardian cannot hook into: vLLM and SGLang, checked from the outside.

- `promtext`: scrape and parse a Prometheus text endpoint.
- `vllm_metrics`: idle KV usage (KVG207) and reload tracking from vLLM's ``/metrics``.
- `kv_events`: decode vLLM's KV-event batches and audit the prefix-cache index they describe (KVG208, KVG105).
- `kv_subscriber`: the ZMQ SUB socket, sequence gaps and replay through the ROUTER socket (KVG209).
- `sglang_metrics`: SGLang's token conservation from its gauges (KVG206).
- `board`: active and resolved findings of a watch; `watch`: the loop, its exporter and its report.
- `vllm_plugin`: the in-process audit of vLLM's own KV cache manager, a ``vllm.general_plugins`` entry point
  loaded inside vLLM (ref counts vs block tables, lost and double frees, conservation, cross-salt sharing).

These modules import prometheus_client, pyzmq and msgpack when used (extras ``prometheus`` and ``zmq``).
"""

from __future__ import annotations

__all__: list[str] = []
