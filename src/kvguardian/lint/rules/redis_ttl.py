"""KVG405 redis-key-no-ttl: a Redis write with no expiry whose key embeds a timestamp or UUID (article ch. 1).

Anti-pattern (the article's own Go example, and the same in Python, Java and Kotlin)::

    key := fmt.Sprintf("user:profile:%s:%d", userID, time.Now().UnixNano())
    redisClient.Set(ctx, key, profile, 0)             // TTL 0: never expires, a new key on every call

    r.set(f"session:{uuid.uuid4()}", blob)            # redis-py, sync or asyncio, or a pipeline

Fix: give the key a TTL (``ex=``/``px=`` in redis-py, a non-zero expiration in go-redis, ``SetArgs.ex`` /
``SetParams.ex`` in Lettuce/Jedis, or ``EXPIRE`` right after), or take the timestamp/UUID out of the key.

Fires, in a module that imports a Redis client (``redis``, ``redis.asyncio``, ``valkey``, ``coredis``…) or on a
receiver whose name says Redis, on write commands (``set``, ``setnx``, ``hset``, ``lpush``, ``rpush``, ``sadd``,
``zadd``, ``xadd``, ``incr``…) whose key expression contains, directly or through a local variable of the same
function, a wall-clock timestamp or a random id (``time.time()``, ``time.time_ns()``, ``uuid4()``,
``datetime.now()``; ``time.Now()``, ``uuid.New()``; ``System.currentTimeMillis()``, ``System.nanoTime()``,
``UUID.randomUUID()``, ``Instant.now()``), when the call carries no expiry and the same function does not
``expire`` that key.

False positives: a key expired elsewhere (another function, a Lua script, a key-space policy such as
``maxmemory-policy allkeys-lru``) is invisible here; silence with ``# noqa: KVG405`` and name the policy.
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
