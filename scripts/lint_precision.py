#!/usr/bin/env python3
"""Reproduce docs/lint-precision.md: lint the Python sources of real inference projects and compare every
finding with its hand classification in the document.

It downloads the pinned wheels with ``pip download --no-deps`` (PyPI; nothing is installed), unpacks their
``.py`` files under ``--dir``, runs ``kv-guardian lint`` over them with the default configuration, and prints
per rule: findings, true and false positives by the document, findings the document does not classify (new)
and classified findings that no longer fire (gone). Exit status 1 when the findings differ from the document
or a rule with >= 5 findings is below 90 % precision.

    .venv/bin/python scripts/lint_precision.py [--dir ~/.cache/kv-guardian/lint-precision] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = ["transformers==5.23.0", "vllm==0.33.0", "sglang==0.5.23", "lmdeploy==0.18.0", "litgpt==0.5.13",
            "exllamav2==0.3.2", "mistral-inference==1.6.0", "deepspeed-mii==0.3.3"]
DOC = Path(__file__).resolve().parents[1] / "docs" / "lint-precision.md"
_ROW = re.compile(r"^\|\s*(KVG\d{3})\s*\|\s*`([^`]+):(\d+)`\s*\|\s*(TP|FP)\s*\|")


def fetch(root: Path) -> Path:
    wheels = root / "wheels"
    src = root / "src"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec in PACKAGES:
        name, version = spec.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        if not any(w.name.startswith(stem) for w in wheels.glob("*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                            "--no-deps", "--only-binary", ":all:", "-d", str(wheels), spec], check=True)
        wheel = next(w for w in wheels.glob("*.whl") if w.name.startswith(stem))
        dest = src / name.replace("-", "_")
        if not dest.is_dir():
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if member.endswith(".py") and ".dist-info/" not in member:
                        z.extract(member, dest)
    return src


def classified() -> dict[tuple[str, str, int], str]:
    out = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            out[(m.group(1), m.group(2), int(m.group(3)))] = m.group(4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "kv-guardian" / "lint-precision")
    ap.add_argument("--json", action="store_true", help="print the per-rule counts as JSON")
    args = ap.parse_args()
    src = fetch(args.dir)
    os.chdir(src)
    from kvguardian.lint import RULES, LintConfig, lint_paths

    result = lint_paths(sorted(p.name for p in src.iterdir()), LintConfig())
    truth = classified()
    found = {(d.rule, d.path, d.line) for d in result.diagnostics}
    rows = {}
    ok = True
    for rule in RULES:
        mine = {k for k in found if k[0] == rule}
        tp = sum(1 for k in mine if truth.get(k) == "TP")
        fp = sum(1 for k in mine if truth.get(k) == "FP")
        new = sorted(f"{p}:{n}" for r, p, n in mine if (r, p, n) not in truth)
        gone = sorted(f"{p}:{n}" for (r, p, n) in truth if r == rule and (r, p, n) not in mine)
        precision = tp / (tp + fp) if tp + fp else None
        rows[rule] = {"findings": len(mine), "tp": tp, "fp": fp, "precision": precision, "new": new, "gone": gone}
        if new or gone or (len(mine) >= 5 and (precision or 0) < 0.9):
            ok = False
    summary = {"files": result.files, "lines": result.lines, "skipped": len(result.skipped), "rules": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{result.files} files, {result.lines} lines, {len(result.skipped)} skipped")
        print("rule    findings  TP  FP  precision")
        for rule, r in rows.items():
            prec = f"{r['precision']:.0%}" if r["precision"] is not None else "-"
            print(f"{rule}  {r['findings']:8d} {r['tp']:3d} {r['fp']:3d}  {prec}")
            for p in r["new"]:
                print(f"   new (not in the document): {p}")
            for p in r["gone"]:
                print(f"   gone (classified, no longer found): {p}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
