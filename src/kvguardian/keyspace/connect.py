"""Connecting to Redis: URLs (``redis://``, ``rediss://``, ``unix://``, ACL user and password), the server's
facts (version, role, ``maxmemory-policy``, uptime), and the masters to scan (every master of a Cluster).

Errors a user can fix (bad URL, refused connection, wrong password, missing ACL permission, a server that
is not Redis) become one `UsageError` line naming the target (never its password) and the fix.

Credentials come from the URL (``redis://USER:PASSWORD@HOST``, ``?password=…``) or, as for redis-cli, from
``REDISCLI_AUTH``; every form is masked as ``***`` in what kv-guardian shows (`display_url`, and any output
through `kvguardian.core.report.secrets`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError, require
from kvguardian.core.report import secrets
from kvguardian.keyspace import cluster
from kvguardian.keyspace.cluster import ClusterNode

if TYPE_CHECKING:
    import redis
    from redis.connection import AbstractConnection

__all__ = ["AUTH_ENV", "Node", "Topology", "connect", "discover", "display_url", "node_client", "url_db"]

SCHEMES = ("redis", "rediss", "unix")
AUTH_ENV = "REDISCLI_AUTH"  # the password when the URL has none, as redis-cli reads it
_SECRET_PAIR = re.compile(r"((?:pass|auth|token|secret)[^=&/]*=)(?!\*\*\*(?:&|$))[^&]*", re.IGNORECASE)


def display_url(url: str) -> str:
    """The URL with every credential (userinfo password, ``password=``-style query values) as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
        query = urlencode([(k, "***" if secrets.SECRET_QUERY.search(k) else v)
                           for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
        shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # not even a URL: hide whatever sits where credentials would
        shown = re.sub(r"(?<=://)[^/@]*@", "***@", url)
    # and anything still shaped like user:password@ or password=…
    return _SECRET_PAIR.sub(r"\1***", re.sub(r"(?<=:)[^:/@]*@", "***@", shown))


def _remember_credentials(url: str) -> str | None:
    """Register every credential in ``url`` (and ``REDISCLI_AUTH``) for masking; the env password to use."""
    secrets.remember_url(url)
    try:
        parts = urlsplit(url)
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return None
    env = os.environ.get(AUTH_ENV)
    secrets.remember(env)
    has_password = password is not None or any(k.lower() == "password" for k, _ in query)
    return env if env and not has_password else None


def _path_db(parts: SplitResult) -> str:
    """The database a split URL's path names (``/3``), as text; '' for none (and for a socket's path)."""
    return parts.path.strip("/") if parts.scheme != "unix" else ""


def _check_url(url: str) -> None:
    where = display_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of 0-65535
    except ValueError as exc:  # its text may quote the URL's credentials: say what is wrong in our words
        what = "the port is not a number in 0-65535" if "port" in str(exc).lower() else "the host part is malformed"
        raise UsageError(f"bad Redis URL {where!r}: {what}; fix: e.g. redis://127.0.0.1:6379/0") from None
    if parts.scheme not in SCHEMES:
        raise UsageError(f"unsupported Redis URL {where!r}: the scheme must be one of "
                         f"{', '.join(s + '://' for s in SCHEMES)} (e.g. redis://127.0.0.1:6379/0)")
    if parts.scheme == "unix" and not parts.path:
        raise UsageError(f"Redis URL {where!r} names no socket path; use unix:///path/to/redis.sock")
    if parts.scheme != "unix" and not parts.hostname:
        raise UsageError(f"Redis URL {where!r} names no host; use redis://HOST:PORT/DB")
    if parts.scheme != "unix" and parts.port == 0:  # redis-py reads port 0 as "none given": 6379, another server
        raise UsageError(f"Redis URL {where!r} names port 0; fix: the server's port, e.g. redis://HOST:6379/0")
    db = _path_db(parts)
    if db and not db.isdigit():
        raise UsageError(f"Redis URL {where!r} names database {db!r}; fix: a database is a number, e.g. "
                         "redis://HOST:PORT/0")


def _auth_message(where: str, reply: str) -> str:
    """What a refused authentication means: no password sent where one is required, or a wrong one."""
    sent = AUTH_ENV if os.environ.get(AUTH_ENV) and "***@" not in where else "the URL"
    if re.search(r"NOAUTH|HELLO must be called|Authentication required", reply, re.I):
        return (f"Redis at {where} requires a password and none was sent; fix: redis://USER:PASSWORD@HOST:PORT "
                f"(or the password in ${AUTH_ENV})")
    return (f"Redis at {where} refused the credentials ({reply}); fix: the user/password in {sent}"
            + (" (redis://USER:PASSWORD@HOST:PORT)" if sent == "the URL" else ""))


def url_db(url: str) -> int | None:
    """The database a Redis URL names (``/N`` or ``?db=N``), None where it names none.

    Raises:
        UsageError: the URL is malformed or its database is not a number.
    """
    _check_url(url)
    parts = urlsplit(url)
    db = _path_db(parts)
    query = dict(parse_qsl(parts.query)).get("db", "")
    if query and not query.isdigit():
        raise UsageError(f"Redis URL {display_url(url)!r} names database {query!r}; fix: a number, e.g. ?db=0")
    return int(query) if query else int(db) if db else None


def connect(url: str, *, timeout: float = 10.0) -> Any:
    """A redis-py client (bytes replies, no retries, a socket timeout) for ``url``; checked with PING.

    Raises:
        UsageError: a bad URL, or a server that refuses us (exit code 3 for an unreachable server).
        DependencyMissing: redis-py is not installed (``pip install 'kv-guardian[redis]'``).
    """
    env_password = _remember_credentials(url)
    _check_url(url)
    redis: Any = require("redis", "redis")
    extra = {"password": env_password} if env_password else {}
    try:
        client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=False,
            retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
            health_check_interval=0, **extra,
        )
    except ValueError as exc:
        raise UsageError(f"bad Redis URL {display_url(url)!r}: {exc}") from None
    try:
        ping(client, display_url(url))
    except TypeError as exc:  # redis-py hands unknown ?options to the connection as keyword arguments
        option = str(exc).rpartition("argument ")[2] or str(exc)
        if "ssl" in option and not url.startswith("rediss://"):
            raise UsageError(f"Redis URL {display_url(url)!r} has the TLS option {option}, which only a rediss:// "
                             "URL takes; fix: use rediss://, or drop the option") from None
        raise UsageError(f"Redis URL {display_url(url)!r} has an option redis-py does not know ({option}); fix: "
                         "drop it (known: db, username, password, socket_timeout, ssl_cert_reqs, …)") from None
    return client


def ping(client: redis.Redis, where: str) -> None:
    """PING, with every failure turned into one line naming ``where`` and the fix."""
    import redis

    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise UsageError(_auth_message(where, str(exc)), exit_code=EXIT_ENVIRONMENT) from None
    except redis.exceptions.NoPermissionError as exc:  # PING itself, or what the connection sends first
        refused = re.search(r"to run the '([^']+)' command", str(exc))  # SELECT (?db=), CLIENT SETNAME, ...
        command = refused.group(1).lower() if refused else "ping"
        raise UsageError(f"Redis at {where}: the ACL user may not run {command.upper().replace('|', ' ')} "
                         f"({exc}); grant +{command} (see README: read-only ACL user)",
                         exit_code=EXIT_ENVIRONMENT) from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        tls = ("; a rediss:// URL speaks TLS: if the server's port is plain Redis, use redis://"
               if where.startswith("rediss://") else "")
        raise UsageError(f"cannot reach Redis at {where}: {exc}; is the server running and the URL right?{tls}",
                         exit_code=EXIT_ENVIRONMENT) from None
    except redis.ResponseError as exc:
        fix = ("; fix: pick a database the server has (CONFIG GET databases; 0 always exists)"
               if "DB index" in str(exc) else "")
        raise UsageError(f"Redis at {where} answered PING with an error: {exc}{fix}",
                         exit_code=EXIT_ENVIRONMENT) from None
    except redis.RedisError as exc:  # InvalidResponse: the reply is not the Redis protocol
        raise UsageError(f"the server at {where} does not speak the Redis protocol ({exc}); fix: check the host "
                         "and port (is it Redis, or an HTTP/TLS port?)", exit_code=EXIT_ENVIRONMENT) from None


@dataclass
class Node:
    """One server to scan: its address and its facts at the start of the scan."""

    addr: str  # host:port or the socket path
    client: Any  # redis-py client for this node
    dbsize: int = 0  # DBSIZE at the start (the progress bar's total)
    uptime_s: int = 0
    role: str = "master"
    db: int = 0


@dataclass
class Topology:
    """What the scan talks to."""

    url: str  # display form, no password
    version: str = ""
    cluster: bool = False
    policy: str = "noeviction"  # maxmemory-policy
    nodes: list[Node] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    idle_unknown: str | None = None  # why idle times (or LFU counters) cannot be read, e.g. an ACL without them
    unreachable: list[str] = field(default_factory=list)  # Cluster shards not read, one line each
    shards: int = 1  # shards the key space is split over (Cluster masters serving slots)

    @property
    def idle_metric(self) -> str:
        """``freq`` under an LFU policy (OBJECT IDLETIME fails there), else ``idletime``."""
        return "freq" if "lfu" in self.policy else "idletime"

    @property
    def dbsize(self) -> int:
        return sum(n.dbsize for n in self.nodes)

    @property
    def version_tuple(self) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in self.version.split(".")[:3])
        except ValueError:
            return (0,)


def _info(client: redis.Redis, section: str, where: str) -> dict[str, Any]:
    import redis

    try:
        return dict(client.info(section))
    except redis.exceptions.NoPermissionError as exc:
        raise UsageError(f"Redis at {where}: the ACL user may not run INFO ({exc}); grant +info",
                         exit_code=EXIT_ENVIRONMENT) from None


def node_client(seed: redis.Redis, host: str, port: int, *, readonly: bool = False) -> Any:
    """A client for another node with the seed's credentials, TLS settings and timeouts; ``readonly``: every
    connection sends READONLY first (reads from a Cluster replica)."""
    import redis

    kwargs = dict(seed.connection_pool.connection_kwargs)
    kwargs.pop("path", None)
    kwargs.update(host=host, port=port, db=0)
    if readonly:
        kwargs["redis_connect_func"] = _readonly_on_connect
    cls = seed.connection_pool.connection_class
    if cls is redis.UnixDomainSocketConnection:
        cls = redis.Connection
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=cls, **kwargs))


def _raw(client: redis.Redis, *args: Any) -> Any:
    """One command without redis-py's reply callbacks (they turn CLUSTER NODES into a dict)."""
    conn = client.connection_pool.get_connection()
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


def _cluster_nodes(seed: redis.Redis, where: str, *, replicas: bool) -> tuple[list[ClusterNode], list[str]]:
    """The node to read for each shard, from CLUSTER NODES (`kvguardian.keyspace.cluster`), and one line for
    each shard that cannot be read."""
    import redis

    try:
        text = _raw(seed, "CLUSTER", "NODES")
    except redis.exceptions.NoPermissionError as exc:
        raise UsageError(f"Redis Cluster at {where}: the ACL user may not run CLUSTER NODES ({exc}); grant "
                         "+cluster|nodes", exit_code=EXIT_ENVIRONMENT) from None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    seed_host = seed.connection_pool.connection_kwargs.get("host", "127.0.0.1")
    return cluster.choose(cluster.shards(cluster.parse_nodes(str(text), seed_host)), replicas=replicas)


def _readonly_on_connect(conn: AbstractConnection) -> None:
    """Connect as usual, then READONLY: a Cluster replica serves reads of its master's slots on this connection."""
    conn.on_connect()
    conn.send_command("READONLY")
    if conn.read_response() not in (b"OK", "OK"):
        raise ConnectionError("READONLY was refused")


def _dbsize(client: redis.Redis, where: str, topo: Topology) -> int:
    """DBSIZE (the progress bar's total); 0 and a warning when the ACL user may not run it."""
    import redis

    try:
        return int(client.dbsize())
    except redis.exceptions.NoPermissionError:
        topo.warnings.append(f"the ACL user may not run DBSIZE on {where}: the progress has no total and "
                             "`dbsize` is 0 (grant +dbsize)")
        return 0


def _idle_denied(client: redis.Redis, metric: str, where: str) -> str | None:
    """Why OBJECT IDLETIME (FREQ under LFU) is refused, or None. Asked about a key that does not exist: the
    ACL check comes first, and a permitted call answers nil, touching nothing."""
    import redis

    sub = "FREQ" if metric == "freq" else "IDLETIME"
    try:
        client.execute_command("OBJECT", sub, "kvguardian:acl-probe:\x00")
    except redis.exceptions.NoPermissionError:
        return (f"the ACL user may not run OBJECT {sub} on {where}, so every key's "
                f"{'LFU counter' if sub == 'FREQ' else 'idle time'} is unknown and KVG301 (cold keys) cannot "
                f"fire; fix: grant +object|{sub.lower()}")
    except redis.ResponseError:
        return None  # e.g. a policy mismatch: the scan reads the other metric
    return None


def discover(seed: redis.Redis, url: str, *, replicas: bool = False) -> Topology:
    """Facts of the server behind ``seed`` and the nodes to scan: the server itself, or one node per shard
    of a Cluster (its master; with ``replicas`` a replica, read through READONLY). A Cluster node that cannot
    be reached is named in ``unreachable`` and the others are scanned.

    Raises:
        UsageError: no node can be read, a refused permission, ``replicas`` on a server that is no Cluster.
    """
    where = display_url(url)
    topo = Topology(url=where)
    server = _info(seed, "server", where)
    memory = _info(seed, "memory", where)
    topo.version = str(server.get("redis_version", ""))
    topo.policy = str(memory.get("maxmemory_policy", "noeviction"))
    cluster_info = _info(seed, "cluster", where)
    topo.cluster = bool(int(cluster_info.get("cluster_enabled", 0) or 0))
    if topo.cluster:
        _cluster_topology(seed, where, topo, replicas=replicas)
    else:
        if replicas:
            raise UsageError(f"--replicas reads the replicas of a Redis Cluster, and {where} is not a Cluster; "
                             "fix: give a replica's own URL to scan it, or drop --replicas",
                             exit_code=EXIT_ENVIRONMENT)
        kw = seed.connection_pool.connection_kwargs
        addr = kw.get("path") or f"{kw.get('host')}:{kw.get('port')}"
        topo.nodes.append(Node(addr=str(addr), client=seed, db=int(kw.get("db", 0) or 0)))
        _node_facts(topo.nodes[0], where, topo, server=server)
    if replicas:
        topo.warnings.append("read from replicas (--replicas): idle times there count from the last replicated "
                             "write, not the last read, so the cold-key verdict (KVG301) is off")
    elif any(n.role != "master" for n in topo.nodes):
        topo.warnings.append("the server is a replica: idle times there count from the last replicated write, "
                             "not the last read, so the cold-key verdict (KVG301) is off; scan the master")
    if not topo.cluster:
        keyspace = _info(seed, "keyspace", where)
        others = [k for k in keyspace if k != f"db{topo.nodes[0].db}"]
        if others:
            topo.warnings.append(f"other databases hold keys too ({', '.join(sorted(others))}); this scan reads "
                                 f"db{topo.nodes[0].db} only (pick one with redis://HOST:PORT/N)")
    return topo


def _node_facts(node: Node, where: str, topo: Topology, *, server: dict[str, Any] | None = None) -> None:
    """Uptime, role and DBSIZE of one node; whether its idle times can be read."""
    info = server if server is not None else _info(node.client, "server", where)
    node.uptime_s = int(info.get("uptime_in_seconds", 0) or 0)
    repl = _info(node.client, "replication", where)
    node.role = str(repl.get("role", "master"))
    node.dbsize = _dbsize(node.client, where, topo)
    topo.idle_unknown = topo.idle_unknown or _idle_denied(node.client, topo.idle_metric, where)


def _cluster_topology(seed: redis.Redis, where: str, topo: Topology, *, replicas: bool) -> None:
    """One node per shard into ``topo.nodes``; a shard that cannot be read into ``topo.unreachable``."""
    import redis

    picked, problems = _cluster_nodes(seed, where, replicas=replicas)
    topo.shards = len(picked) + len(problems)
    topo.unreachable.extend(problems)
    for found in picked:
        node = Node(addr=found.addr, client=node_client(seed, found.host, found.port, readonly=replicas))
        try:
            node.client.ping()
            _node_facts(node, found.addr, topo)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            topo.unreachable.append(f"{'replica' if replicas else 'master'} {found.addr} cannot be reached "
                                    f"({type(exc).__name__}: {exc}): its keys were not read")
            continue
        except redis.RedisError:
            ping(node.client, found.addr)  # one line naming the node and the fix (a password, an ACL)
            raise
        topo.nodes.append(node)
    if not topo.nodes:
        raise UsageError(f"Redis Cluster at {where}: no shard can be read ({'; '.join(problems or topo.unreachable)})"
                         "; is the cluster up (redis-cli --cluster check HOST:PORT)?", exit_code=EXIT_ENVIRONMENT)
