"""Reading the corpus: each program's expectation, and running one under real ``kv-guardian run``.

A program's docstring says ``expect: leak`` or ``expect: clean`` and, for a leak, one or more
``holder: TEXT`` lines: every KVG102 warning or error of the program must name one of them in its holder
chain. Usable as a script: ``python tests/corpus/corpus.py leak_session_dict`` prints the outcome.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FLAG_IDS = ("KVG101", "KVG102", "KVG103")
RANK = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class Expectation:
    name: str
    leak: bool
    holders: tuple[str, ...]


@dataclass
class Outcome:
    rc: int
    stderr: str
    findings: list[dict] = field(default_factory=list)

    def flagged(self) -> list[dict]:
        return [f for f in self.findings if f["id"] in FLAG_IDS and RANK[f["severity"]] >= 1]

    def kvg102(self) -> list[dict]:
        return [f for f in self.findings if f["id"] == "KVG102"]

    def signature(self) -> list[tuple[str, str, str]]:
        """What must be identical run after run: each finding's id, severity and holder chain."""
        return sorted((f["id"], f["severity"], " → ".join(f.get("holder_chain") or [])) for f in self.findings)


def programs() -> list[Path]:
    return sorted(p for p in HERE.glob("*.py") if p.name.startswith(("leak_", "clean_")))


def expectation(path: Path) -> Expectation:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    fields: dict[str, list[str]] = {}
    for line in doc.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("expect", "holder"):
            fields.setdefault(key.strip(), []).append(value.strip())
    (expect,) = fields["expect"]
    assert expect in ("leak", "clean"), f"{path.name}: expect: leak|clean, not {expect!r}"
    return Expectation(path.stem, expect == "leak", tuple(fields.get("holder", ())))


def run(path: Path, *, timeout: float = 600, options: tuple[str, ...] = ()) -> Outcome:
    """``path`` under ``kv-guardian run --fail-on warning`` (and ``options``): its exit code and findings."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-m", "kvguardian", "run", "--output", str(report), "--fail-on", "warning", *options,
             "--", sys.executable, str(path)],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        data = json.loads(report.read_text()) if report.exists() else {"findings": []}
    return Outcome(proc.returncode, proc.stderr, data["findings"])


def problems(exp: Expectation, out: Outcome) -> list[str]:
    """Everything in ``out`` that does not meet ``exp`` (empty: it passes)."""
    bad = []
    for f in out.kvg102():
        chain = " → ".join(f.get("holder_chain") or [])
        if not chain or "<unknown holder" in chain or "<no Python object" in chain:
            bad.append(f"a KVG102 chain names no holder: {chain!r}")
    if exp.leak:
        if out.rc != 1 or not out.flagged():
            bad.append(f"not flagged (exit {out.rc}): {[(f['id'], f['severity']) for f in out.findings]}")
        for f in out.kvg102():
            chain = " → ".join(f.get("holder_chain") or [])
            if RANK[f["severity"]] >= 1 and not any(h in chain for h in exp.holders):
                bad.append(f"KVG102 {f['severity']} does not name {exp.holders}: {chain}")
    else:
        if out.rc != 0:
            bad.append(f"exit {out.rc}: {out.stderr[-2000:]}")
        bad += [f"{f['id']} {f['severity']}: {f['message']}" for f in out.findings if RANK[f["severity"]] >= 1]
    return bad


if __name__ == "__main__":
    for name in sys.argv[1:] or [p.stem for p in programs()]:
        p = HERE / f"{name.removesuffix('.py')}.py"
        o = run(p)
        issues = problems(expectation(p), o)
        print(f"{'ok  ' if not issues else 'FAIL'} {p.stem}", *issues, sep="\n    ", flush=True)
