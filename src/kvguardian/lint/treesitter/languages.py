"""Go, Java and Kotlin through tree-sitter: each language's node types for functions, calls and assignments,
reduced to one small shape (`Call`, `FunctionFacts`) that the Redis rule reads.

Grammars come from PyPI (``tree-sitter``, ``tree-sitter-go``, ``tree-sitter-java``, ``tree-sitter-kotlin``:
``pip install 'kv-guardian[lint]'``) and load on first use.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tree_sitter import Node

__all__ = ["LANGUAGE_MODULES", "Call", "FunctionFacts", "code", "functions", "imports", "parser_for"]

LANGUAGE_MODULES = {"go": "tree_sitter_go", "java": "tree_sitter_java", "kotlin": "tree_sitter_kotlin"}

_FUNCTIONS = {
    "go": {"function_declaration", "method_declaration", "func_literal"},
    "java": {"method_declaration", "constructor_declaration", "lambda_expression"},
    "kotlin": {"function_declaration", "lambda_literal", "anonymous_function", "secondary_constructor"},
}
_PARSERS: dict[str, Any] = {}


@dataclass(frozen=True)
class Call:
    method: str
    receiver: str  # source text of what the method is called on ("" for a plain call)
    args: list[str]  # argument source texts
    codes: list[str]  # the same with string and character literals emptied (`code`)
    line: int  # 1-based
    col: int  # 1-based
    end_line: int
    end_col: int


@dataclass
class FunctionFacts:
    calls: list[Call] = field(default_factory=list)
    #: (variable, right-hand side as `code`: literals emptied), in order
    assigns: list[tuple[str, str]] = field(default_factory=list)


def parser_for(language: str) -> Any:
    """A tree-sitter parser for ``language``; raises ImportError when the grammar is not installed."""
    parser = _PARSERS.get(language)
    if parser is None:
        import tree_sitter

        grammar = importlib.import_module(LANGUAGE_MODULES[language])
        parser = tree_sitter.Parser(tree_sitter.Language(grammar.language()))
        _PARSERS[language] = parser
    return parser


def _text(node: Node | None) -> str:
    return (node.text or b"").decode("utf-8", "replace") if node is not None else ""


#: string and character literals of the three grammars
_LITERALS = {"interpreted_string_literal", "raw_string_literal", "rune_literal", "string_literal",
             "character_literal", "multiline_string_literal"}
_KOTLIN_SHORT_TEMPLATE = re.compile(r"\$[A-Za-z_]\w*")


def _literals(node: Node) -> Iterator[Any]:
    """The outermost literals under ``node``, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in _LITERALS:
            yield n
        else:
            stack.extend(reversed(n.children))


def code(node: Node | None) -> str:
    """``node``'s source with every string and character literal emptied (``"config:last-key"`` -> ``""``) but
    what a Kotlin template interpolates kept (``"s:$id:${f()}"`` -> ``"$id ${f()}"``): identifiers and calls are
    matched in code, never in a literal's text."""
    if node is None:
        return ""
    text, start, pos, parts = node.text or b"", node.start_byte, 0, []
    for lit in _literals(node):
        parts.append(text[pos:lit.start_byte - start].decode("utf-8", "replace"))
        parts.append(_template(lit))
        pos = lit.end_byte - start
    parts.append(text[pos:].decode("utf-8", "replace"))
    return "".join(parts)


def _template(lit: Node) -> str:
    """A literal as code: empty quotes around the Kotlin templates it interpolates."""
    kept = [code(c) for c in lit.named_children if c.type == "interpolation"]
    content = "".join(_text(c) for c in lit.named_children if c.type == "string_content")
    kept += _KOTLIN_SHORT_TEMPLATE.findall(content)  # "$id " is sometimes parsed as two string_content nodes
    return '"' + " ".join(kept) + '"'


def _call(language: str, node: Node) -> Call | None:
    if language == "go" and node.type == "call_expression":
        fn, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
        if fn is None or fn.type != "selector_expression" or args is None:
            return None
        name = _text(fn.child_by_field_name("field"))
        receiver = _text(fn.child_by_field_name("operand"))
        arg_nodes = args.named_children
    elif language == "java" and node.type == "method_invocation":
        name = _text(node.child_by_field_name("name"))
        receiver = _text(node.child_by_field_name("object"))
        args = node.child_by_field_name("arguments")
        arg_nodes = args.named_children if args is not None else []
    elif language == "kotlin" and node.type == "call_expression":
        nav = node.named_children[0] if node.named_children else None
        vargs = next((c for c in node.named_children if c.type == "value_arguments"), None)
        if nav is None or nav.type != "navigation_expression" or vargs is None:
            return None
        ids = [c for c in nav.named_children if c.type in ("identifier", "simple_identifier", "navigation_suffix")]
        name = _text(ids[-1]).lstrip(".?") if ids else ""
        receiver = _text(nav.named_children[0])
        arg_nodes = [c.named_children[-1] if c.named_children else c for c in vargs.named_children]
    else:
        return None
    (r0, c0), (r1, c1) = node.start_point, node.end_point
    kept = [a for a in arg_nodes if a.type != "comment"]
    return Call(name, receiver, [_text(a) for a in kept], [code(a) for a in kept], r0 + 1, c0 + 1, r1 + 1, c1 + 1)


def _assign(language: str, node: Node) -> list[tuple[str, str]]:
    t = node.type
    if language == "go" and t in ("short_var_declaration", "assignment_statement"):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            return []
        return list(zip((_text(n) for n in left.named_children), (code(n) for n in right.named_children)))
    if language == "go" and t == "var_spec":
        names = [_text(c) for c in node.children_by_field_name("name")]
        value = node.child_by_field_name("value")
        return [(n, code(value)) for n in names] if value is not None else []
    if language == "java" and t in ("variable_declarator", "assignment_expression"):
        left = node.child_by_field_name("name") or node.child_by_field_name("left")
        right = node.child_by_field_name("value") or node.child_by_field_name("right")
        return [(_text(left), code(right))] if left is not None and right is not None else []
    if language == "kotlin" and t in ("property_declaration", "assignment"):
        kids = node.named_children
        decl = next((c for c in kids if c.type in ("variable_declaration", "directly_assignable_expression",
                                                   "identifier", "simple_identifier")), None)
        if decl is None or len(kids) < 2:
            return []
        name = _text(decl.named_children[0] if decl.named_children else decl)
        return [(name, code(kids[-1]))]
    return []


def functions(language: str, root: Node) -> Iterator[FunctionFacts]:
    """Facts of every function (nested ones separately), plus one for top-level code."""
    kinds = _FUNCTIONS[language]
    pending = [root]
    while pending:
        top = pending.pop()
        facts = FunctionFacts()
        stack = list(reversed(top.children))
        while stack:
            node = stack.pop()
            if node.type in kinds:
                pending.append(node)
                continue
            call = _call(language, node)
            if call is not None:
                facts.calls.append(call)
            facts.assigns.extend(_assign(language, node))
            stack.extend(reversed(node.children))
        # calls are found outermost first; order them by position so "a later EXPIRE" means later in source
        facts.calls.sort(key=lambda c: (c.line, c.col))
        yield facts


_IMPORTS = {"import_declaration", "import", "import_list", "import_header"}


def imports(root: Node) -> list[str]:
    """The text of every top-level import of a Go, Java or Kotlin file (Go: the whole import block)."""
    return [_text(n) for n in root.children if n.type in _IMPORTS]


def first_error_line(root: Node) -> int:
    """Line of the first syntax error tree-sitter recovered from, or 0."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return int(node.start_point[0]) + 1
        if node.has_error:
            stack.extend(reversed(node.children))
    return 0
