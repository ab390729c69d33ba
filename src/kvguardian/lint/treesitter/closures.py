"""KVG406 on Go and Java: a request handler's closure that captures its cache, kept where it outlives the request.

The rule and its documentation are `kvguardian.lint.rules.callbacks`; this module finds, in a tree-sitter tree:

- closures: a Go ``func`` literal; a Java lambda, anonymous class or ``local::method`` reference;
- what they capture: a handler's name that holds a KV cache, a tensor map or a ``generate``/``forward`` result;
- long-lived places: a package variable, field or registration (``addListener``, ``scheduleAtFixedRate``...)
  that nothing undoes or bounds, or a goroutine that loops forever.

What each of these covers, case by case: docs/design/lint.md (KVG406).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tree_sitter import Node

from kvguardian.lint.rules.base import Hit
from kvguardian.lint.rules.callbacks import HANDLER_NAME, REQUEST_PARAMS
from kvguardian.lint.treesitter.languages import code

__all__ = ["check_closures"]

_SCOPES = {"go": {"function_declaration", "method_declaration", "func_literal"},
           "java": {"method_declaration", "constructor_declaration", "lambda_expression"}}
_CACHE_WORD = re.compile(r"(?i)(kv|cache|past_?key_?values?|pkv|tensor|logits|hidden_?states?)")
_RESULT_TYPE = re.compile(r"(Result|Output)s?\b")
_RESULT_NAME = re.compile(r"(?i)^(out|outs|output|outputs|result|results|res|gen|generation|generated)$")
_PRODUCERS = re.compile(r"(?i)^(generate\w*|forward|prefill|decode|infer\w*|predict\w*|run_?model|model_?step)$")
_VALUE_METHODS = re.compile(r"(?i)^(len|size|count|num|is|has|to_?string|string|hash|equals|bytes)")
_PLAIN_TYPE = re.compile(r"^\*?(string|bool|byte|rune|error|u?int\d*|float\d+|complex\d+|int|long|short|char|"
                         r"double|float|boolean|String|Integer|Long|Double|Float|Boolean|Duration|Instant|"
                         r"time\.\w+)$")
_REGISTER = re.compile(r"(?i)^(register\w*|subscribe\w*|on|once|add\w*(listener|handler|callback|hook|observer|"
                       r"watcher)s?|schedule(AtFixedRate|WithFixedDelay)|handle(func)?|watch\w*)$")
_REMOVE = re.compile(r"(?i)^(remove\w*|unregister\w*|deregister\w*|unsubscribe\w*|off|cancel\w*|dispose|close|"
                     r"stop|delete|unwatch)$")
_STORE = re.compile(r"^(add|addAll|addLast|addFirst|offer|offerLast|push|put|putIfAbsent|Store|"
                    r"LoadOrStore|PushBack|PushFront)$")
_BOUNDED = re.compile(r"^\[\s*\w+\s*\]|\bmake\(\s*chan\b|\blru\.|\bNewLRU|\bring\.New|expirable|ttlcache|"
                      r"ArrayBlockingQueue|EvictingQueue|CircularFifoQueue|maximumSize|removeEldestEntry|LRUMap|"
                      r"LruCache|expireAfter|WeakHashMap|\b(List|Set|Map)\.of\(|Collections\.unmodifiable")


@dataclass
class _Scope:
    node: Any
    name: str
    parent: _Scope | None
    handler: bool
    in_handler: bool  # this function or one around it is a handler: its declarations matter
    #: declared name -> does it hold a cache, tensor map or result?
    names: dict[str, bool] = field(default_factory=dict)
    closures: dict[str, Any] = field(default_factory=dict)  # local variable -> the closure it holds


def _t(node: Node | None) -> str:
    return (node.text or b"").decode("utf-8", "replace") if node is not None else ""


def _walk(node: Node, stop: set[str]) -> Iterator[Any]:
    """``node``'s descendants in source order, not entering nodes whose type is in ``stop``."""
    stack = list(reversed(node.children))
    while stack:
        n = stack.pop()
        yield n
        if n.type not in stop:
            stack.extend(reversed(n.children))


def _holds_cache(name: str, type_text: str, value: Node | None, known: dict[str, bool], language: str) -> bool:
    """Does a declaration hold a cache, tensor map or result? By its value if it has one, else by its type,
    else (an untyped parameter) by its name."""
    if value is not None:
        return _is_cache_value(value, known, language)
    if type_text:
        if _CACHE_WORD.search(type_text) or _RESULT_TYPE.search(type_text):
            return True
        return not _PLAIN_TYPE.match(type_text.strip()) and bool(_CACHE_WORD.search(name) or
                                                                  _RESULT_NAME.match(name))
    return bool(_CACHE_WORD.search(name) or _RESULT_NAME.match(name))


def _is_cache_value(value: Node, known: dict[str, bool], language: str) -> bool:
    t = value.type
    if t in ("expression_list", "parenthesized_expression", "unary_expression", "cast_expression") \
            and value.named_children:
        return _is_cache_value(value.named_children[-1], known, language)
    if t == "identifier":
        return known.get(_t(value), False)
    if t in ("selector_expression", "field_access"):
        last = value.child_by_field_name("field")
        return bool(_CACHE_WORD.search(_t(last)))
    if t in ("call_expression", "method_invocation"):
        fn = value.child_by_field_name("function") if language == "go" else value.child_by_field_name("name")
        if fn is not None and fn.type == "selector_expression":
            fn = fn.child_by_field_name("field")
        method = _t(fn)
        if method == "make" or method == "new":  # make(map[string]Tensor), new(KVCache)
            return bool(_CACHE_WORD.search(code(value)))
        if _VALUE_METHODS.match(method):
            return False
        return bool(_CACHE_WORD.search(method) or _PRODUCERS.match(method))
    if t in ("composite_literal", "object_creation_expression", "array_creation_expression"):
        kind = value.child_by_field_name("type")
        return bool(_CACHE_WORD.search(_t(kind)))
    return False


def _is_closure(node: Node, language: str) -> bool:
    if language == "go":
        return bool(node.type == "func_literal")
    if node.type == "lambda_expression":
        return True
    if node.type == "object_creation_expression":
        return any(c.type == "class_body" for c in node.children)
    return bool(node.type == "method_reference" and node.named_children
                and node.named_children[0].type == "identifier")


def _closures_in(arg: Node, scope: _Scope, language: str) -> Iterator[Any]:
    """Closures an argument holds: itself, a local that holds one, or one passed to ``new Thread(...)``."""
    if _is_closure(arg, language):
        yield arg
    elif arg.type == "identifier":
        s: _Scope | None = scope
        while s is not None:
            if _t(arg) in s.closures:
                yield s.closures[_t(arg)]
                return
            s = s.parent
    if arg.type == "object_creation_expression" and not _is_closure(arg, language):
        args = arg.child_by_field_name("arguments")
        for a in args.named_children if args is not None else []:
            yield from _closures_in(a, scope, language)


def _captured(closure: Node, scope: _Scope, language: str) -> str | None:
    """The first name the closure uses that a handler scope declared as holding a cache, unless the closure
    declares that name itself (a parameter or a local of its own)."""
    own = {name for name, _, _ in _declarations(closure, language, deep=True)}
    for node in [closure, *_walk(closure, set())]:
        if node.type != "identifier" or _t(node) in own:
            continue
        parent = node.parent
        if parent is not None and language == "java" and parent.type in ("method_invocation", "field_access") \
                and parent.child_by_field_name("object") != node:
            continue  # a method or field name, not a variable
        for s in _handler_chain(scope):
            if _t(node) in s.names:
                if s.names[_t(node)]:
                    return _t(node)
                break
    return None


def _declarations(fn: Node, language: str, deep: bool = False) -> Iterator[tuple[str, str, Any]]:
    """(name, type text, value node or None) of each parameter and local a function declares; with ``deep``
    also those of the functions nested in it."""
    stop = set() if deep else _SCOPES[language] | {"class_body"}
    params = fn.child_by_field_name("parameters")
    nodes = [*(_walk(params, stop) if params is not None else []), *_walk(fn, stop)]
    for n in nodes:
        if language == "go" and n.type in ("parameter_declaration", "var_spec"):
            kind = _t(n.child_by_field_name("type"))
            value = n.child_by_field_name("value")
            for name in n.children_by_field_name("name"):
                yield _t(name), kind, value
        elif language == "go" and n.type == "short_var_declaration":
            left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
            values = right.named_children if right is not None else []
            for i, name in enumerate(left.named_children if left is not None else []):
                yield _t(name), "", values[i] if i < len(values) else None
        elif language == "java" and n.type in ("formal_parameter", "local_variable_declaration",
                                               "enhanced_for_statement", "catch_formal_parameter"):
            kind = _t(n.child_by_field_name("type"))
            for d in n.children_by_field_name("declarator") or [n]:
                yield _t(d.child_by_field_name("name")), kind, d.child_by_field_name("value")
    if language == "java" and fn.type == "lambda_expression":
        for name in _param_names(fn):
            yield name, "", None


def _is_handler(fn: Node, name: str, language: str) -> bool:
    if HANDLER_NAME.match(name):
        return True
    params = _t(fn.child_by_field_name("parameters"))
    if re.search(r"\bhttp\.(ResponseWriter|Request)\b|\*gin\.Context\b|\becho\.Context\b|\*fiber\.Ctx\b|"
                 r"\b(HttpServletRequest|ServerRequest|HttpExchange|ServerWebExchange|RoutingContext)\b", params):
        return True
    if language == "java":
        mods = next((c for c in fn.children if c.type == "modifiers"), None)
        if re.search(r"@(Get|Post|Put|Delete|Patch|Request|Message)Mapping\b|@(GET|POST|PUT|Path|OnMessage)\b",
                     _t(mods)):
            return True
    return bool(_param_names(fn) & REQUEST_PARAMS)


def _param_names(fn: Node) -> set[str]:
    params = fn.child_by_field_name("parameters")
    if params is None:
        return set()
    if params.type == "identifier":  # a Java lambda's single parameter
        return {_t(params)}
    return {_t(n) for n in _walk(params, {"func_literal", "lambda_expression"}) if n.type == "identifier"
            and n.parent is not None and n.parent.type in ("parameter_declaration", "formal_parameter",
                                                           "inferred_parameters")}


def _scope(fn: Node, parent: _Scope | None, language: str) -> _Scope:
    name = _t(fn.child_by_field_name("name")) if fn.type != "func_literal" else ""
    handler = _is_handler(fn, name, language) if fn.type != "lambda_expression" else False
    s = _Scope(fn, name, parent, handler, handler or (parent is not None and parent.in_handler))
    if not s.in_handler:
        return s  # names declared outside any handler are not the request's
    known: dict[str, bool] = {}
    for p in reversed(list(_handler_chain(parent))):  # outermost first: an inner declaration shadows an outer one
        known.update(p.names)
    for var, kind, value in _declarations(fn, language):
        s.names[var] = _holds_cache(var, kind, value, known, language)
        if value is not None and _is_closure(value, language):
            s.closures[var] = value
            s.names[var] = _captured(value, s, language) is not None  # a closure that holds the cache
        known[var] = s.names[var]
    return s


def _chain(s: _Scope | None) -> Iterator[_Scope]:
    while s is not None:
        yield s
        s = s.parent


def _handler_chain(s: _Scope | None) -> Iterator[_Scope]:
    """``s`` and the functions around it, up to the innermost handler: where a request's names are declared."""
    while s is not None and s.in_handler:
        yield s
        if s.handler:
            return
        s = s.parent


@dataclass
class _File:
    language: str
    state: dict[str, bool]  # long-lived container -> bounded
    root: Any
    hits: list[Hit] = field(default_factory=list)
    _bodies: str | None = None
    _removed: dict[str, bool] = field(default_factory=dict)

    def removed(self, name: str) -> bool:
        """Does a function or method of the file empty, replace or remove from ``name``? (A declaration's
        initial value and a Java constructor are not removals.) Worked out for the names a store meets only."""
        if self._bodies is None:
            bodies = {"go": ("function_declaration", "method_declaration"), "java": ("method_declaration",)}
            self._bodies = "\n".join(code(n.child_by_field_name("body")) for n in _walk(self.root, set())
                                     if n.type in bodies[self.language])
        if name not in self._removed:
            n = re.escape(name)
            self._removed[name] = re.search(
                rf"\b{n}\s*\.\s*(remove\w*|clear|poll\w*|retainAll|Delete|LoadAndDelete|Remove\w*|Range)\s*\(|"
                rf"\b(delete|clear)\(\s*[\w.]*\b{n}\b|\b{n}\s*=\s*(nil\b|[\w.]*\b{n}\[|make\(|map\[|new\b)",
                self._bodies) is not None
        return self._removed[name]


def check_closures(language: str, root: Node) -> list[Hit]:
    """KVG406 hits of a Go or Java file's tree."""
    f = _File(language, _state(language, root), root)
    _visit(f, root, None)
    return sorted(f.hits, key=lambda h: (h.line, h.col))


def _visit(f: _File, node: Node, scope: _Scope | None) -> None:
    for n in _walk(node, _SCOPES[f.language]):
        if n.type in _SCOPES[f.language]:
            _visit(f, n, _scope(n, scope, f.language))
        elif scope is not None and scope.in_handler:
            _site(f, n, scope)


def _site(f: _File, n: Any, scope: _Scope) -> None:
    """One statement or call: a registration of a closure, a store into a long-lived container, a goroutine."""
    lang = f.language
    if lang == "go" and n.type == "go_statement":
        call = n.named_children[0] if n.named_children else None
        fn = call.child_by_field_name("function") if call is not None else None
        if fn is not None and fn.type == "func_literal" and _forever(fn):
            _report(f, n, fn, scope, "starts a goroutine that never ends")
        return
    if lang == "go" and n.type == "assignment_statement":
        left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
        for target, value in zip(left.named_children, right.named_children):
            if target.type == "index_expression" and "%" in _t(target.child_by_field_name("index")):
                continue  # a fixed ring of slots
            if target.type == "index_expression":
                args = [value]
            elif _t(value).startswith("append("):
                a = value.child_by_field_name("arguments")
                args = a.named_children[1:] if a is not None else []
            else:
                continue
            _store(f, n, target, args, scope)
        return
    if lang == "java" and n.type == "assignment_expression":
        left = n.child_by_field_name("left")
        if left is not None and left.type == "array_access":
            _store(f, n, left.child_by_field_name("array"), [n.child_by_field_name("right")], scope)
        return
    method, receiver, args = _call_parts(n, lang)
    if method is None:
        return
    if receiver is not None and _STORE.match(method):
        _store(f, n, receiver, args, scope)
    elif _REGISTER.match(method) and not _removes_later(scope, n, lang):
        for a in args:
            for c in _closures_in(a, scope, lang):
                _report(f, n, c, scope, f"registers a closure with {method}()")


def _call_parts(n: Node, lang: str) -> tuple[str | None, Any, list[Any]]:
    if lang == "go" and n.type == "call_expression":
        fn, args = n.child_by_field_name("function"), n.child_by_field_name("arguments")
        if fn is None or fn.type != "selector_expression" or args is None:
            return None, None, []
        return _t(fn.child_by_field_name("field")), fn.child_by_field_name("operand"), args.named_children
    if lang == "java" and n.type == "method_invocation":
        args = n.child_by_field_name("arguments")
        return (_t(n.child_by_field_name("name")), n.child_by_field_name("object"),
                args.named_children if args is not None else [])
    return None, None, []


def _target(node: Node | None, lang: str) -> str:
    """The long-lived container a store writes into (``hooks``, ``s.hooks``, ``this.hooks``, ``S.HOOKS``)."""
    if node is None:
        return ""
    if node.type == "index_expression":
        node = node.child_by_field_name("operand")
    if node is None:
        return ""
    if node.type in ("selector_expression", "field_access"):
        node = node.child_by_field_name("field")
    return _t(node) if node is not None and node.type in ("identifier", "field_identifier") else ""


def _store(f: _File, n: Node, target: Any, args: list[Any], scope: _Scope) -> None:
    name = _target(target, f.language)
    if name not in f.state or f.state[name] or f.removed(name):
        return
    bare = target.type in ("identifier", "index_expression") and _target(target, f.language) == _t(
        target.child_by_field_name("operand") if target.type == "index_expression" else target)
    if bare and any(name in s.names for s in _handler_chain(scope)):
        return  # a local of the same name
    for a in args:
        for c in _closures_in(a, scope, f.language):
            _report(f, n, c, scope, f"adds a closure to long-lived '{name}' (nothing in this file removes it)")


def _report(f: _File, n: Node, closure: Node, scope: _Scope, what: str) -> None:
    var = _captured(closure, scope, f.language)
    if var is None:
        return
    handler = next(s for s in _chain(scope) if s.handler)
    (r0, c0), (r1, c1) = n.start_point, n.end_point
    f.hits.append(Hit(r0 + 1, c0 + 1, f"request handler {handler.name or 'func'}() {what}, capturing '{var}' (a "
                      "cache, tensor map or result): the request's cache stays alive as long as it is "
                      "kept; remove it when the request ends or register once at start-up", r1 + 1, c1 + 1))


def _removes_later(scope: _Scope, n: Node, lang: str) -> bool:
    """Does the handler undo a registration: a removal on the same receiver (``bus.removeListener(cb)``), or a
    use of the handle the registration returned (``defer unsub()``, ``future.cancel(true)``)? Other closes
    (``r.Body.Close()``) are not."""
    fn = next(s for s in _chain(scope) if s.handler).node
    kept = _result_name(n)
    _, registry, _ = _call_parts(n, lang)
    for m in _walk(fn, set()):
        method, receiver, _ = _call_parts(m, lang)
        if method and _REMOVE.match(method) and _t(receiver) == _t(registry):
            return True
        called = m.child_by_field_name("function") if m.type == "call_expression" else None
        if kept and (_t(called) == kept or _t(receiver) == kept):
            return True  # unsub := bus.Subscribe(f); defer unsub()
    return False


def _result_name(call: Node) -> str:
    """The variable a registration's result (its unsubscribe handle) is kept in, or ''."""
    node = call.parent
    while node is not None and node.type in ("expression_list", "variable_declarator", "short_var_declaration",
                                             "assignment_statement", "assignment_expression"):
        target = node.child_by_field_name("left") or node.child_by_field_name("name")
        if target is not None:
            return _t(target.named_children[0] if target.type == "expression_list" else target)
        node = node.parent
    return ""


def _forever(fn: Node) -> bool:
    """A goroutine body with a loop that nothing ends (no condition, no return/break, no ``ctx.Done()``)."""
    body = fn.child_by_field_name("body")
    if body is None:
        return False
    for loop in _walk(body, {"func_literal"}):
        if loop.type != "for_statement":
            continue
        clause = [c for c in loop.named_children if c.type != "block"]
        forever = not clause or (clause[0].type == "range_clause" and
                                 re.search(r"\.C\b|time\.Tick\(", _t(clause[0])) is not None)
        exits = any(x.type in ("return_statement", "break_statement", "goto_statement")
                    for x in _walk(loop, {"func_literal"}))
        if forever and not exits and "Done()" not in _t(loop):
            return True
    return False


def _state(language: str, root: Node) -> dict[str, bool]:
    """Long-lived containers (Go package variables and struct fields, Java fields) -> bounded."""
    state: dict[str, bool] = {}
    for n in _walk(root, {"block", "constructor_body"}):  # declarations, not function bodies
        if language == "go" and n.type == "var_spec" and n.parent is not None \
                and n.parent.parent is not None and n.parent.parent.type == "source_file":
            kind = _t(n.child_by_field_name("type")) + " " + _t(n.child_by_field_name("value"))
            for name in n.children_by_field_name("name"):
                state[_t(name)] = bool(_BOUNDED.search(kind.strip()))
        elif language == "go" and n.type == "field_declaration":
            kind = _t(n.child_by_field_name("type"))
            for name in n.children_by_field_name("name"):
                state[_t(name)] = bool(_BOUNDED.search(kind))
        elif language == "java" and n.type == "field_declaration":
            kind = _t(n.child_by_field_name("type"))
            for d in n.children_by_field_name("declarator"):
                state[_t(d.child_by_field_name("name"))] = bool(_BOUNDED.search(kind + " " + _t(d)))
    return state
