"""The share of annotated parameters of src/kvguardian typed ``Any`` (issue: replace Any by real types).

    python scripts/any_share.py [--top N]
"""

from __future__ import annotations

import argparse
import ast
import collections
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvguardian"


def parameters(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.arg not in ("self", "cls"):
                    yield arg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=15)
    n = typed_any = 0
    names: collections.Counter[str] = collections.Counter()
    for path in sorted(SRC.rglob("*.py")):
        if path.name.startswith("deviceplugin_pb2"):
            continue
        for arg in parameters(ast.parse(path.read_text())):
            n += 1
            if arg.annotation is not None and ast.unparse(arg.annotation) in ("Any", "typing.Any"):
                typed_any += 1
                names[arg.arg] += 1
    top = ap.parse_args().top
    print(f"{typed_any} of {n} parameters typed Any ({100 * typed_any / max(n, 1):.1f} %)")
    print("most common:", ", ".join(f"{k} x{v}" for k, v in names.most_common(top)))


if __name__ == "__main__":
    main()
