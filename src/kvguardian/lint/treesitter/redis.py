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

__all__ = ["check_function", "uses_redis"]

_GO_WRITES = {"Set", "SetNX", "HSet", "HSetNX", "HMSet", "LPush", "RPush", "SAdd", "ZAdd", "Incr", "IncrBy",
              "IncrByFloat", "HIncrBy", "PFAdd", "GetSet", "SetArgs", "ZIncrBy"}
_JVM_WRITES = {"set", "setnx", "setNX", "hset", "hmset", "hsetnx", "hSet", "lpush", "rpush", "leftPush",
               "rightPush", "sadd", "zadd", "incr", "incrBy", "incrby", "hincrBy", "pfadd", "getSet", "putIfAbsent",
               "setIfAbsent", "put", "add", "increment"}
_EXPIRE = re.compile(r"^(P?Expire(At)?|p?expire(At)?|pexpireat|expireat)$")
_GO_TIME = re.compile(r"\btime\.Now\(\)|\buuid\.(New|NewString|NewRandom|Must)\b|\bxid\.New\(\)|\bulid\.(Make|New)\b")
_JVM_TIME = re.compile(r"\bSystem\.(currentTimeMillis|nanoTime)\(|\bUUID\.randomUUID\(|\b(Instant|LocalDateTime|"
                       r"ZonedDateTime|OffsetDateTime|LocalDate)\.now\(|\bnew Date\(\)|\bClock\.System\.now\(")
_JVM_PARAMS = re.compile(r"\b(SetParams|SetArgs|setParams)\b")
# keepttl is no expiry: it keeps the TTL the key already has, and a new key has none
_JVM_PARAM_TTL = re.compile(r"\.\s*(ex|px|exAt|pxAt)\s*\(", re.IGNORECASE)
_JVM_ZERO = re.compile(r"^(Duration\.ZERO|Duration\.of\w+\(\s*0L?\s*\)|0L?)$")  # a zero timeout: no expiry


def _tainted(facts: FunctionFacts, pattern: re.Pattern[str]) -> set[str]:
    names: set[str] = set()
    for var, rhs in facts.assigns:
        if pattern.search(rhs) or any(re.search(rf"\b{re.escape(n)}\b", rhs) for n in names):
            names.add(var)
    return names


def _is_time(text: str, pattern: re.Pattern[str], names: set[str]) -> bool:
    return bool(pattern.search(text)) or any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


_GO_UPPER = {m.upper() for m in _GO_WRITES}


def _go_write(call: Call) -> tuple[str, int, bool] | None:
    """(command, index of the key argument, has expiry) of a go-redis or redigo write, else None."""
    if call.method in ("Do", "Send") and len(call.args) >= 2:  # redigo: conn.Do("SET", key, v, "EX", 60); Send queues
        cmd = call.args[0].strip('"`').upper()
        if cmd not in _GO_UPPER:
            return None
        return cmd, 1, any(a.strip('"`').upper() in ("EX", "PX", "EXAT", "PXAT") for a in call.args[2:])
    if call.method not in _GO_WRITES or len(call.args) < 2:
        return None
    if call.method in ("Set", "SetNX"):
        return call.method, 1, not _no_expiration(call.args[3] if len(call.args) > 3 else "0")
    if call.method == "SetArgs":
        return call.method, 1, bool(re.search(r"\b(TTL|ExpireAt)\s*:", " ".join(call.args[3:])))
    return call.method, 1, False


#: go-redis expirations that set none: zero however it is spelled (0, time.Duration(0), 0*time.Minute), KeepTTL
_GO_NO_EXPIRATION = re.compile(r"^(?:\(?\s*(?:time\.Duration\(\s*0\s*\)|0)\s*\)?(?:\s*\*\s*time\.\w+)?|"
                               r"redis\.KeepTTL)$")


def _no_expiration(arg: str) -> bool:
    return bool(_GO_NO_EXPIRATION.match(arg.strip()))


def _jvm_write(call: Call, assigned: dict[str, str]) -> tuple[str, int, bool] | None:
    if call.method not in _JVM_WRITES or len(call.args) < 2:
        return None
    if call.method in ("put", "add", "increment", "putIfAbsent") and len(call.args) < 3:
        return None  # Map.put / List.add; RedisTemplate's opsForHash().put has the key first and three args
    with_ttl = call.method in ("set", "setIfAbsent") and any(_jvm_ttl(a, assigned) for a in call.codes[2:])
    return call.method, 0, with_ttl


def _jvm_ttl(arg: str, assigned: dict[str, str]) -> bool:
    """Does a third (or later) argument of ``set`` give an expiry? A Duration, a number, a TTL constant
    (``SESSION_LIFETIME``) or a timeout and its TimeUnit do, unless it is zero (``Duration.ZERO``); Jedis
    ``SetParams`` / Lettuce ``SetArgs`` (built there or in a variable) only with ``ex``/``px``/``exAt``/``pxAt``."""
    text = assigned.get(arg.strip(), arg)
    if _JVM_ZERO.match(text.strip()):
        return False
    if _JVM_PARAMS.search(text):
        return bool(_JVM_PARAM_TTL.search(text))
    return True


#: a Redis client package in an import, or a receiver that says it is one (``rdb``, ``redisClient``, ``jedis``)
_CLIENT_IMPORT = re.compile(r"redis|redigo|rueidis|valkey|jedis|lettuce|redisson", re.IGNORECASE)
_CLIENT_RECEIVER = re.compile(r"redis|\brdb\b|valkey|jedis|lettuce|redisson", re.IGNORECASE)


def uses_redis(imports: list[str]) -> bool:
    """Does the file import a Redis client (go-redis, redigo, rueidis, valkey-go, Jedis, Lettuce, Spring Data
    Redis, Redisson)?"""
    return any(_CLIENT_IMPORT.search(i) for i in imports)


def check_function(language: str, facts: FunctionFacts, client_imported: bool = True) -> Iterator[Hit]:
    """KVG405 hits of one function. HTTP headers, URL queries and maps have ``Set``/``set``/``put`` too: without
    a Redis client import the receiver itself must name one."""
    pattern = _GO_TIME if language == "go" else _JVM_TIME
    names = _tainted(facts, pattern)
    assigned = dict(facts.assigns)
    for i, call in enumerate(facts.calls):
        found = _go_write(call) if language == "go" else _jvm_write(call, assigned)
        if found is None or not (client_imported or _CLIENT_RECEIVER.search(call.receiver)):
            continue
        cmd, key_index, has_ttl = found
        key = call.args[key_index]
        if has_ttl or not _is_time(call.codes[key_index], pattern, names):  # names in code, not in literals
            continue
        later = facts.calls[i + 1:]
        if any(_EXPIRE.match(c.method) and len(c.args) > key_index and c.args[key_index].strip() == key.strip()
               for c in later):
            continue
        short = key if len(key) <= 50 else key[:49] + "…"
        yield Hit(call.line, call.col, MESSAGE.format(cmd=cmd.upper(), key=short), call.end_line, call.end_col)
