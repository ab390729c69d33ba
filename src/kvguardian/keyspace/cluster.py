"""A Redis Cluster's shards from ``CLUSTER NODES``: which node to read for each master's slots, and what
cannot be read (a master marked failing, a shard without a healthy replica when replicas are asked for).

Pure parsing, no connection: `kvguardian.keyspace.connect` asks the server and connects to what `choose`
picks. Every slot-serving master is one shard; its replicas (``slave`` flag, master id in the fourth field)
hold the same keys, so reading one node per shard reads every key once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClusterNode", "Shard", "choose", "parse_nodes", "shards"]

_UNHEALTHY = frozenset({"fail", "fail?", "handshake", "noaddr"})


@dataclass(frozen=True)
class ClusterNode:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # the master a replica follows; None for a master
    slots: int  # slots it serves (migrating/importing markers not counted)
    connected: bool

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def healthy(self) -> bool:
        """Not marked failing (or half-known) by the node we asked, and its link is up."""
        return self.connected and not self.flags & _UNHEALTHY


@dataclass
class Shard:
    """A master serving slots and its replicas."""

    master: ClusterNode
    replicas: list[ClusterNode] = field(default_factory=list)


def _slot_count(tokens: list[str]) -> int:
    n = 0
    for tok in tokens:
        if tok.startswith("["):  # [slot->-id] / [slot-<-id]: a migration in progress, owned elsewhere
            continue
        low, _, high = tok.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            n += int(high or low) - int(low) + 1
    return n


def parse_nodes(text: str, default_host: str) -> list[ClusterNode]:
    """The nodes of a ``CLUSTER NODES`` reply; ``default_host`` for a node that knows no address of its own
    (``:6379@16379`` before it met another node). Lines that are not node lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        addr = parts[1].split("@")[0].split(",")[0]
        host, _, port = addr.rpartition(":")
        if not port.isdigit():
            continue
        flags = frozenset(parts[2].split(","))
        out.append(ClusterNode(node_id=parts[0], host=host or default_host, port=int(port), flags=flags,
                               master_id=None if parts[3] == "-" else parts[3], slots=_slot_count(parts[8:]),
                               connected=parts[7] == "connected"))
    return out


def shards(nodes: list[ClusterNode]) -> list[Shard]:
    """One shard per master that serves slots (a master without slots has no keys), by address."""
    by_id = {n.node_id: Shard(n) for n in nodes if "master" in n.flags and n.slots > 0}
    for n in nodes:
        if "slave" in n.flags and n.master_id in by_id:
            by_id[n.master_id].replicas.append(n)
    return sorted(by_id.values(), key=lambda s: (s.master.host, s.master.port))


def choose(found: list[Shard], *, replicas: bool) -> tuple[list[ClusterNode], list[str]]:
    """The node to read for each shard (its master, or with ``replicas`` its first healthy replica, by
    address) and one line for each shard that cannot be read."""
    picked: list[ClusterNode] = []
    problems: list[str] = []
    for shard in found:
        m = shard.master
        if not replicas:
            if m.healthy:
                picked.append(m)
            else:
                state = ",".join(sorted(m.flags & _UNHEALTHY)) or "disconnected"
                problems.append(f"master {m.addr} ({m.slots} slots) is marked {state}: its keys were not read")
            continue
        ok = sorted((r for r in shard.replicas if r.healthy), key=lambda r: (r.host, r.port))
        if ok:
            picked.append(ok[0])
        else:
            problems.append(f"master {m.addr} ({m.slots} slots) has no healthy replica: its keys were not read "
                            "(--replicas reads replicas only; drop it to read the master)")
    return picked, problems
