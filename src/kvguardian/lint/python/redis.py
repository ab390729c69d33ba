"""redis-py's write commands (sync, asyncio and pipelines share the names) and where their expiry goes."""

from __future__ import annotations

import ast

from kvguardian.lint.python import names as N

__all__ = ["REDIS_WRITES", "has_expiry", "redis_keys"]

#: write commands that create a key; ``setex``/``psetex`` always carry a TTL and are not listed
REDIS_WRITES = {"set", "setnx", "mset", "msetnx", "hset", "hsetnx", "hmset", "lpush", "rpush", "sadd", "zadd",
                "xadd", "pfadd", "geoadd", "incr", "incrby", "incrbyfloat", "hincrby", "hincrbyfloat", "getset",
                "setrange", "zincrby", "json_set"}
#: ``keepttl`` is not one: it keeps the TTL the key already has, and a new key (one named by a timestamp) has none
_EXPIRY_KWARGS = ("ex", "px", "exat", "pxat")


def redis_keys(node: ast.Call, method: str) -> list[ast.expr]:
    """The key expressions a write names: its first argument, or the keys of an ``mset`` mapping."""
    first = node.args[0] if node.args else (N.keyword(node, "name") or N.keyword(node, "key"))
    if first is None:
        return []
    if method in ("mset", "msetnx") and isinstance(first, ast.Dict):
        return [k for k in first.keys if k is not None]
    return [first]


def has_expiry(node: ast.Call, method: str) -> bool:
    """Does the call itself give the key a TTL (or pass ``**kwargs`` we cannot see)?"""
    if any(kw.arg is None for kw in node.keywords):
        return True
    if method != "set":
        return False
    if any(not N.is_none(v) and not N.is_false(v) for v in map(lambda k: N.keyword(node, k), _EXPIRY_KWARGS)
           if v is not None):
        return True
    return any(not N.is_none(a) for a in node.args[2:4])
