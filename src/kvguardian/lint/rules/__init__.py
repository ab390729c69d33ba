"""The lint rules, one module each; `RULES` maps every id to its `Rule`. Add a module and a line here."""

from __future__ import annotations

from kvguardian.lint.rules import (
    callbacks,
    global_store,
    grad_loop,
    kept_exception,
    memo,
    redis_ttl,
    request_map,
)
from kvguardian.lint.rules.base import Hit, Rule

__all__ = ["RULES", "Hit", "Rule"]

#: rule id -> rule; Python rules first. KVG405 also runs on Go, Java and Kotlin (`kvguardian.lint.treesitter`).
RULES: dict[str, Rule] = {
    r.id: r
    for r in (grad_loop.RULE, global_store.RULE, memo.RULE, kept_exception.RULE, redis_ttl.RULE, callbacks.RULE,
              request_map.RULE)
}
