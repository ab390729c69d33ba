"""KVG405 redis-key-no-ttl: a Redis write with no expiry whose key embeds a timestamp or UUID (article ch. 1).

Fires, with a Redis client in scope (Python, Go, Java, Kotlin), on a write command whose key contains a
wall-clock timestamp or random id, directly or through a local, when the call sets no expiry and the same
function does not ``expire`` the key.

Fix: give the key a TTL (``ex=``/``px=``, a non-zero go-redis expiration, ``SetArgs.ex``), or take the timestamp
or UUID out of the key.

False positives: a key expired elsewhere or by ``maxmemory-policy``; silence with ``# noqa: KVG405``. See
docs/design/lint.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kvguardian.lint.python.index import ModuleIndex
from kvguardian.lint.python.redis import has_expiry, redis_keys
from kvguardian.lint.rules.base import Hit, Rule, describe, hit

ID = "KVG405"
MESSAGE = ("Redis {cmd} of key {key} without expiry: the key embeds a timestamp/UUID, so every call creates a "
           "new key that never expires; pass an expiry or EXPIRE the key")


_CLIENT_PACKAGES = {"redis", "aioredis", "coredis", "valkey", "rediscluster", "walrus", "fakeredis"}


def _is_redis_receiver(node: ast.Call, module_uses_redis: bool) -> bool:
    """``torch.distributed`` stores, metrics and dicts have ``set`` too: the module must use a Redis client, or
    the receiver must say it is one (``redis.set``, ``self.redis_client.set``, ``valkey_pipe.set``)."""
    receiver = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
    return module_uses_redis or "redis" in receiver.lower() or "valkey" in receiver.lower()


def check(ix: ModuleIndex) -> Iterator[Hit]:
    uses_redis = bool(ix.import_roots & _CLIENT_PACKAGES)
    for rc in ix.redis_calls:
        if not rc.key_is_time or has_expiry(rc.node, rc.method) or not _is_redis_receiver(rc.node, uses_redis):
            continue
        expired = ix.expired.get(id(rc.function.node) if rc.function else 0, set())
        keys = redis_keys(rc.node, rc.method)
        if any(ast.unparse(k) in expired for k in keys):
            continue
        yield hit(rc.node, MESSAGE.format(cmd=rc.method.upper(), key=describe(keys[0], 50)))


RULE = Rule(ID, "python", check, __doc__ or "")
