"""Offline Redis analysis: a streaming reader of RDB snapshots (versions 9-12: Redis 5.0 to 8.x), fed into
the same pattern mining, statistics, verdicts and JSON schema as a live scan, at zero server CPU per key.

Modules: `format` (opcodes, value types, length and string encodings), `reader` (the streaming reader:
key, type, size estimate, expiry, idle time or LFU counter per key), `size` (how a key's memory is
estimated from its serialized form), `snapshot` (fetching a snapshot through the replication handshake,
as ``redis-cli --rdb`` does), `scan` (RDB → `ScanResult`).
"""

from __future__ import annotations

__all__: list[str] = []
