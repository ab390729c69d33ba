"""Holder chains as a tree: hundreds of KVG102/KVG105 chains grouped by their shared root and path, with counts.

Chains are merged step by step from the root. A step's varying part - a dict key, a list index, a tensor's
shape, everything in brackets - is folded to ``[…]`` so ``dict['user-1']`` and ``dict['user-7']`` are one node
(``dict[…] ×36``) that keeps a few of the real steps as examples. Runs of steps every chain below shares are
drawn as one line (``Session.cache → DynamicCache.layers → list[…]``). The tree is nested ``<details>``: it
opens and closes without JavaScript.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvguardian.core.report.document import FindingView
from kvguardian.core.report.html.axes import human_bytes
from kvguardian.core.report.html.markup import el, text, truncate

__all__ = ["HolderNode", "build_tree", "fold_step", "render_tree"]

_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_EXAMPLES = 4  # raw steps kept per node
_LEAF_ITEMS = 12  # requests listed under a leaf
_MAX_DEPTH = 40
_MAX_CHILDREN = 50  # children drawn per node; the rest are counted


def fold_step(step: str) -> str:
    """``dict['user-1']`` -> ``dict[…]``; ``Tensor[1×2×8×16] float32`` -> ``Tensor[…] float32``."""
    return _BRACKETS.sub("[…]", step)


@dataclass
class HolderNode:
    """One folded step and every chain through it."""

    label: str
    count: int = 0  # chains through this node
    bytes: int = 0  # KV bytes those chains hold (from the findings' evidence)
    examples: dict[str, int] = field(default_factory=dict)  # raw step -> chains (at most _EXAMPLES kept)
    children: dict[str, HolderNode] = field(default_factory=dict)
    ends: list[str] = field(default_factory=list)  # who ends here: "request r-17 (KVG102)" (bounded)
    ended: int = 0  # chains that end here

    def add(self, raw: str, nbytes: int) -> None:
        self.count += 1
        self.bytes += nbytes
        if raw in self.examples or len(self.examples) < _EXAMPLES:
            self.examples[raw] = self.examples.get(raw, 0) + 1


def build_tree(findings: Iterable[FindingView]) -> HolderNode:
    """A root (label ``""``) whose children are the chains' roots."""
    root = HolderNode("")
    for f in findings:
        if not f.holder_chain:
            continue
        nbytes = f.evidence.get("bytes")
        nbytes = int(nbytes) if isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool) else 0
        root.add("", nbytes)
        node = root
        for raw in f.holder_chain[:_MAX_DEPTH]:
            key = fold_step(raw)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = HolderNode(key)
            child.add(raw, nbytes)
            node = child
        node.ended += 1
        if len(node.ends) < _LEAF_ITEMS:
            who = f.evidence.get("request_id")
            node.ends.append(f"{f.id} request {who}" if who is not None else f"{f.id} {truncate(f.message, 80)}")
    return root


def _run(node: HolderNode) -> tuple[list[HolderNode], HolderNode]:
    """The steps from ``node`` down while each has one child that every chain goes through."""
    run = [node]
    while len(node.children) == 1 and not node.ended:
        (child,) = node.children.values()
        if child.count != node.count:
            break
        run.append(child)
        node = child
    return run, node


def _label(node: HolderNode) -> str:
    if len(node.examples) == 1 and next(iter(node.examples)) == node.label:
        return text(node.label)
    shown = ", ".join(text(truncate(r, 60)) for r in node.examples)
    more = node.count - sum(node.examples.values())
    return (f"{text(node.label)} <span class=\"eg\">(e.g. {shown}"
            + (f", +{more} more" if more > 0 else "") + ")</span>")


def _render(node: HolderNode, depth: int) -> str:
    run, last = _run(node)
    path = " <span class=\"arrow\" aria-hidden=\"true\">→</span> ".join(_label(n) for n in run)
    summary = el("summary", f"<span class=\"path\">{path}</span> "
                            f"<span class=\"count\">×{node.count}</span> "
                            f"<span class=\"bytes\">{text(human_bytes(node.bytes))}</span>")
    body = []
    kids = sorted(last.children.values(), key=lambda n: (-n.count, n.label))
    for child in kids[:_MAX_CHILDREN]:
        body.append(_render(child, depth + 1))
    if len(kids) > _MAX_CHILDREN:
        rest = sum(n.count for n in kids[_MAX_CHILDREN:])
        body.append(el("p", text(f"… {len(kids) - _MAX_CHILDREN} more branches ({rest} chains)"), class_="more"))
    if last.ended:
        items = "".join(el("li", text(e)) for e in last.ends)
        if last.ended > len(last.ends):
            items += el("li", text(f"… and {last.ended - len(last.ends)} more"), class_="more")
        body.append(el("ul", items, class_="ends"))
    return el("details", summary + "".join(body), class_="holder", open=depth < 2, data_count=node.count,
              data_depth=depth, data_path=" → ".join(n.label for n in run)[:300])


def render_tree(findings: Iterable[FindingView]) -> str:
    """The holder-chain tree of ``findings`` (those with a chain), or an empty string when none has one."""
    root = build_tree(findings)
    if not root.children:
        return ""
    kids = sorted(root.children.values(), key=lambda n: (-n.count, n.label))
    trees = "".join(_render(child, 0) for child in kids[:_MAX_CHILDREN])
    if len(kids) > _MAX_CHILDREN:
        trees += el("p", text(f"… {len(kids) - _MAX_CHILDREN} more roots"), class_="more")
    intro = el("p", text(f"{root.count} holder chain(s) from {len(kids)} root(s), holding "
                         f"{human_bytes(root.bytes)}; steps that differ only in a key, an index or a shape are "
                         "grouped as […]."), class_="note")
    return el("div", intro + trees, class_="holder-tree", data_chains=root.count, data_roots=len(kids))
