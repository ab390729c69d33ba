"""`HolderChain`: what the holder search returns for one KV storage."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ROOT_KINDS", "HolderChain"]

# where a chain starts: a module global, a class attribute, an executing frame's local, a contextvar, an
# asyncio task or loop, an interpreter hook (trace/profile function, signal handler), the autograd graph,
# C (no Python root: the nearest Python objects are named), none
ROOT_KINDS = ("module", "class", "frame", "context", "asyncio", "interpreter", "autograd", "c", "none")


@dataclass
class HolderChain:
    """A rendered path from a root to a KV storage."""

    steps: list[str]  # root first, the KV tensor last
    root: str  # one of ROOT_KINDS
    complete: bool  # True when it starts at a Python root
    depth: int = 0
    notes: list[str] = field(default_factory=list)
    # what `retention` needs to judge whether the holder is bounded
    nodes: list[int] = field(default_factory=list)  # id() of each object on the path, root-most first
    node_steps: list[str] = field(default_factory=list)  # a short label per node (its type, or the step)
    bounds: dict[int, str] = field(default_factory=dict)  # node id -> a declared size bound on that node
    containers: list[int] = field(default_factory=list)  # node ids that are collections (dict, list, linked, ...)
    sizes: dict[int, int] = field(default_factory=dict)  # collection node id -> its length at search time
    linked: dict[int, str] = field(default_factory=dict)  # node id -> "Turn.parent": head of a linked structure
    stopped: bool = False  # the search budget ran out before this chain reached a root

    def render(self) -> str:
        return " → ".join(self.steps)
