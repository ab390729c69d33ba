#!/usr/bin/env python3
"""Reproduce docs/lint-precision.md: precision on real projects, precision and recall on the labelled set.

Real projects (the default; needs PyPI): downloads the pinned wheels with ``pip download --no-deps`` (nothing is
installed), unpacks their ``.py`` files under ``--dir``, runs ``kv-guardian lint`` over each with the default
configuration, and prints per rule: findings, true and false positives by the document, findings the document
does not classify (new) and classified findings that no longer fire (gone). Exit status 1 when the findings or
the per-package file and line counts differ from the document, or a rule with >= 5 findings is below 90 %.

Labelled set (``--labelled``; offline, run by tests/unit/lint/test_lint_precision_doc.py): lints the files that
tests/fixtures/lint/labels.toml names, counts per rule true positives, false positives and misses against the
labels (and the fixtures' ``# expect:`` markers), and prints the document's section for it. Exit status 1 when
the document's section differs; ``--update-doc`` writes it.

    .venv/bin/python scripts/lint_precision.py [--dir ~/.cache/kv-guardian/lint-precision] [--json]
    .venv/bin/python scripts/lint_precision.py --labelled [--update-doc]
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

import tomllib

PACKAGES = ["transformers==5.23.0", "vllm==0.33.0", "sglang==0.5.23", "lmdeploy==0.18.0", "litgpt==0.5.13",
            "exllamav2==0.3.2", "mistral-inference==1.6.0", "deepspeed-mii==0.3.3", "mlx-lm==0.32.2",
            "redisvl==0.28.0"]
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "lint-precision.md"
LABELS = ROOT / "tests" / "fixtures" / "lint" / "labels.toml"
FIXTURES = "tests/fixtures/lint"
_ROW = re.compile(r"^\|\s*(KVG\d{3})\s*\|\s*`([^`]+):(\d+)`\s*\|\s*(TP|FP)\s*\|")
_PACKAGE_ROW = re.compile(r"^\|\s*([\w.-]+)\s*\|\s*([\w.]+)\s*\|\s*([\d,]+)\s*\|\s*([\d,]+)\s*\|$")
_EXPECT = re.compile(r"(?://|#)\s*expect:\s*(KVG\d{3}(?:\s*,\s*KVG\d{3})*)")
_BEGIN, _END = "<!-- labelled-set:begin (scripts/lint_precision.py --labelled --update-doc) -->", \
    "<!-- labelled-set:end -->"


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


def documented_packages() -> dict[str, tuple[int, int]]:
    """``| name | version | files | lines |`` rows of the document: name==version -> (files, lines)."""
    out = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = _PACKAGE_ROW.match(line)
        if m and m.group(1) != "package":
            out[f"{m.group(1)}=={m.group(2)}"] = (int(m.group(3).replace(",", "")), int(m.group(4).replace(",", "")))
    return out


def real_projects(args: argparse.Namespace) -> int:
    src = fetch(args.dir)
    os.chdir(src)
    from kvguardian.lint import RULES, LintConfig, lint_paths

    found: set[tuple[str, str, int]] = set()
    packages = {}
    skipped = 0
    for spec in PACKAGES:
        result = lint_paths([spec.split("==")[0].replace("-", "_")], LintConfig())
        found |= {(d.rule, d.path, d.line) for d in result.diagnostics}
        packages[spec] = (result.files, result.lines)
        skipped += len(result.skipped)
    truth = classified()
    rows = {}
    ok = packages == documented_packages()
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
    files = sum(f for f, _ in packages.values())
    lines = sum(n for _, n in packages.values())
    summary = {"files": files, "lines": lines, "skipped": skipped, "packages": packages, "rules": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0 if ok else 1
    print(f"{files} files, {lines} lines, {skipped} skipped")
    for spec, (f, n) in packages.items():
        mark = "" if documented_packages().get(spec) == (f, n) else "   (the document says otherwise)"
        print(f"  {spec}: {f} files, {n} lines{mark}")
    print("rule    findings  TP  FP  precision")
    for rule, r in rows.items():
        prec = f"{r['precision']:.0%}" if r["precision"] is not None else "-"
        print(f"{rule}  {r['findings']:8d} {r['tp']:3d} {r['fp']:3d}  {prec}")
        for p in r["new"]:
            print(f"   new (not in the document): {p}")
        for p in r["gone"]:
            print(f"   gone (classified, no longer found): {p}")
    return 0 if ok else 1


Label = tuple[str, str, int]  # (rule, path, line)


def _labels() -> tuple[list[str], dict[Label, str], dict[Label, str], list[tuple[str, str]]]:
    """(sources, leak labels -> why, known misses -> why the rule misses them, outside (path, why)) from
    labels.toml and the fixtures' ``# expect:`` markers."""
    spec = tomllib.loads(LABELS.read_text(encoding="utf-8"))
    leaks = {(e["rule"], e["file"], int(e["line"])): e["why"] for e in spec.get("leak", [])}
    explained = {(e["rule"], e["file"], int(e["line"])): e["missed"] for e in spec.get("leak", []) if "missed" in e}
    for path in sorted((ROOT / FIXTURES).iterdir()):
        if path.suffix not in (".py", ".go", ".java", ".kt"):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = _EXPECT.search(line)
            if m:
                for rid in m.group(1).split(","):
                    leaks[(rid.strip(), f"{FIXTURES}/{path.name}", lineno)] = "fixture marker"
    outside = [(e["file"], e["why"]) for e in spec.get("outside", [])]
    return list(spec["sources"]), leaks, explained, outside


def labelled_section() -> tuple[str, list[str]]:
    """The document's labelled-set section, and what is wrong with the labels (a corpus leak program without a
    label, a miss without its reason, a reason for a miss that is now found)."""
    os.chdir(ROOT)
    from kvguardian.lint import RULES, LintConfig, lint_paths

    sources, leaks, explained, outside = _labels()
    result = lint_paths(sources, LintConfig())
    found = {(d.rule, d.path, d.line): d.message for d in result.diagnostics}
    leak_programs = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "corpus").glob("leak_*.py")}
    covered = {f for _, f, _ in leaks} | {f for f, _ in outside}
    problems = [f"{p}: a corpus leak program with no [[leak]] or [[outside]] entry"
                for p in sorted(leak_programs - covered)]
    out = [_BEGIN, "",
           f"{result.files} files, {result.lines:,} lines ({len(result.skipped)} deliberately unparsable fixtures "
           f"skipped); {len(leaks)} leak lines, every other line clean for every rule.", "",
           "| rule | leak lines | findings | TP | FP | misses | precision | recall |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    fps, misses = [], []
    for rule in RULES:
        mine = {k for k in found if k[0] == rule}
        labelled = {k for k in leaks if k[0] == rule}
        tp = len(mine & labelled)
        fp = sorted(mine - labelled, key=lambda k: (k[1], k[2]))
        miss = sorted(labelled - mine, key=lambda k: (k[1], k[2]))
        fps += fp
        misses += miss
        precision = f"{tp / len(mine):.0%}" if mine else "–"
        recall = f"{tp / len(labelled):.0%}" if labelled else "–"
        out.append(f"| {rule} {RULES[rule].doc.split(':', 1)[0].split(' ', 1)[1]} | {len(labelled)} | {len(mine)} "
                   f"| {tp} | {len(fp)} | {len(miss)} | {precision} | {recall} |")
    out += ["", f"**False positives ({len(fps)}).**", ""]
    out += [f"- {r} `{p}:{n}`: {found[(r, p, n)][:100]}" for r, p, n in fps] or ["- none"]
    out += ["", f"**Misses ({len(misses)}).**", ""]
    out += [f"- {r} `{p}:{n}`: {leaks[(r, p, n)]}. *Missed:* {explained.get((r, p, n), 'not explained')}"
            for r, p, n in misses] or ["- none"]
    problems += [f"{r} {p}:{n}: a miss with no `missed` reason" for r, p, n in misses if (r, p, n) not in explained]
    problems += [f"{r} {p}:{n}: found now, but labels.toml says why it is missed" for r, p, n in explained
                 if (r, p, n) in found]
    out += ["", f"**Corpus leaks that are no rule's anti-pattern ({len(outside)}; counted in no rule).**", ""]
    out += [f"- `{Path(p).name}`: {why}" for p, why in outside]
    out += ["", _END]
    return "\n".join(out), problems


def labelled(args: argparse.Namespace) -> int:
    section, problems = labelled_section()
    doc = DOC.read_text(encoding="utf-8")
    start, end = doc.find(_BEGIN), doc.find(_END)
    current = doc[start:end + len(_END)] if start >= 0 and end > start else None
    if args.update_doc and current is not None:
        DOC.write_text(doc.replace(current, section), encoding="utf-8")
        current = section
    print(section)
    for problem in problems:
        print(f"tests/fixtures/lint/labels.toml: {problem}", file=sys.stderr)
    if current != section:
        print("docs/lint-precision.md: the labelled-set section differs from the lint run; fix: "
              "scripts/lint_precision.py --labelled --update-doc, then read the diff", file=sys.stderr)
        return 1
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "kv-guardian" / "lint-precision")
    ap.add_argument("--json", action="store_true", help="print the per-rule counts as JSON")
    ap.add_argument("--labelled", action="store_true", help="precision and recall on the labelled set (offline)")
    ap.add_argument("--update-doc", action="store_true", help="with --labelled: rewrite the document's section")
    args = ap.parse_args()
    return labelled(args) if args.labelled else real_projects(args)


if __name__ == "__main__":
    raise SystemExit(main())
