"""KVG405 on Go (go-redis, redigo), Java and Kotlin (Jedis, Lettuce, Spring's RedisTemplate).

The rule itself and its documentation are `kvguardian.lint.rules.redis_ttl`; this module knows where each
client puts the key and the expiry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kvguardian.lint.rules.base import Hit
from kvguardian.lint.rules.redis_ttl import MESSAGE
from kvguardian.lint.treesitter.languages import Call, FunctionFacts

__all__ = ["check_function"]

_GO_WRITES = {"Set", "SetNX", "HSet", "HSetNX", "HMSet", "LPush", "RPush", "SAdd", "ZAdd", "Incr", "IncrBy",
              "IncrByFloat", "HIncrBy", "PFAdd", "GetSet", "SetArgs", "ZIncrBy"}
_JVM_WRITES = {"set", "setnx", "setNX", "hset", "hmset", "hsetnx", "hSet", "lpush", "rpush", "leftPush",
               "rightPush", "sadd", "zadd", "incr", "incrBy", "incrby", "hincrBy", "pfadd", "getSet", "putIfAbsent",
               "setIfAbsent", "put", "add", "increment"}
_EXPIRE = re.compile(r"^(P?Expire(At)?|p?expire(At)?|pexpireat|expireat)$")
_GO_TIME = re.compile(r"\btime\.Now\(\)|\buuid\.(New|NewString|NewRandom|Must)\b|\bxid\.New\(\)|\bulid\.(Make|New)\b")
_JVM_TIME = re.compile(r"\bSystem\.(currentTimeMillis|nanoTime)\(|\bUUID\.randomUUID\(|\b(Instant|LocalDateTime|"
                       r"ZonedDateTime|OffsetDateTime|LocalDate)\.now\(|\bnew Date\(\)|\bClock\.System\.now\(")
_JVM_TTL = re.compile(r"\b(ex|px|exAt|pxAt|Duration|TimeUnit|ofSeconds|ofMillis|ofMinutes|ofHours|timeout|ttl|"
                      r"expire|expiration|SECONDS|MILLISECONDS|MINUTES|HOURS|DAYS)\b|^\d+L?$", re.IGNORECASE)


def _tainted(facts: FunctionFacts, pattern: re.Pattern[str]) -> set[str]:
    names: set[str] = set()
    for var, rhs in facts.assigns:
        if pattern.search(rhs) or any(re.search(rf"\b{re.escape(n)}\b", rhs) for n in names):
            names.add(var)
    return names


def _is_time(text: str, pattern: re.Pattern[str], names: set[str]) -> bool:
    return bool(pattern.search(text)) or any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


_GO_UPPER = {m.upper() for m in _GO_WRITES}


def _go_write(call: Call) -> tuple[str, str, bool] | None:
    """(command, key text, has expiry) of a go-redis or redigo write, else None."""
    if call.method == "Do" and len(call.args) >= 2:  # redigo: conn.Do("SET", key, v, "EX", 60)
        cmd = call.args[0].strip('"`').upper()
        if cmd not in _GO_UPPER:
            return None
        return cmd, call.args[1], any(a.strip('"`').upper() in ("EX", "PX", "EXAT", "PXAT") for a in call.args[2:])
    if call.method not in _GO_WRITES or len(call.args) < 2:
        return None
    key = call.args[1]
    if call.method in ("Set", "SetNX"):
        exp = call.args[3].strip() if len(call.args) > 3 else "0"
        return call.method, key, exp not in ("0", "redis.KeepTTL", "0*time.Second", "0 * time.Second")
    if call.method == "SetArgs":
        return call.method, key, bool(re.search(r"\b(TTL|ExpireAt)\s*:", " ".join(call.args[3:])))
    return call.method, key, False


def _jvm_write(call: Call) -> tuple[str, str, bool] | None:
    if call.method not in _JVM_WRITES or len(call.args) < 2:
        return None
    if call.method in ("put", "add", "increment", "putIfAbsent") and len(call.args) < 3:
        return None  # Map.put / List.add; RedisTemplate's opsForHash().put has the key first and three args
    with_ttl = call.method in ("set", "setIfAbsent") and any(_JVM_TTL.search(a.strip()) for a in call.args[2:])
    return call.method, call.args[0], with_ttl


def check_function(language: str, facts: FunctionFacts) -> Iterator[Hit]:
    pattern = _GO_TIME if language == "go" else _JVM_TIME
    names = _tainted(facts, pattern)
    write = _go_write if language == "go" else _jvm_write
    key_index = 1 if language == "go" else 0
    for i, call in enumerate(facts.calls):
        found = write(call)
        if found is None:
            continue
        cmd, key, has_ttl = found
        if has_ttl or not _is_time(key, pattern, names):
            continue
        later = facts.calls[i + 1:]
        if any(_EXPIRE.match(c.method) and len(c.args) > key_index and c.args[key_index].strip() == key.strip()
               for c in later):
            continue
        short = key if len(key) <= 50 else key[:49] + "…"
        yield Hit(call.line, call.col, MESSAGE.format(cmd=cmd.upper(), key=short), call.end_line, call.end_col)
