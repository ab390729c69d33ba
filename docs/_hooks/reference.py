"""MkDocs hook: the reference pages, generated from the code at every build so they cannot drift from it.

* ``reference/cli.md``: every (sub)command's ``--help``, walked from `kvguardian.apps.cli.build_parser`;
* ``reference/findings.md``: every finding id of `kvguardian.core.findings.CATALOG` (meaning, evidence, fix, and
  the modules that raise it);
* ``reference/metrics.md``: every metric of `kvguardian.core.exporters.catalog.METRICS` and every recording rule
  and alert of ``deploy/prometheus/*.yml``.

None of them is committed: ``mkdocs build`` writes them into the site (``on_files`` adds them as generated
files). ``tests/integration/docs/test_docs_site.py`` builds the site and checks that they list everything.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HELP_COLUMNS = "100"  # the terminal width the help texts are rendered at

#: What each finding carries as evidence (``finding.evidence``, and the holder chain where it has one). The
#: meaning and the fix come from the catalog; a test fails when an id has no entry here or an entry no id.
EVIDENCE: dict[str, str] = {
    "KVG100": "the hook site that failed (`site`), the contained errors by site and the first exception",
    "KVG101": "the request and layers whose KV is tracked by autograd, the graph's nodes and saved-tensor bytes "
              "when first seen (at which sequence length), the updates made with gradients, the live KV bytes",
    "KVG102": "the request and tenant that owned the KV, bytes, entries, layers, kinds, seconds since the owner "
              "ended, the holder chain from a root to the KV, and the retention verdict (`evidence.retention`: "
              "sizes over time, evictions seen, the declared bound)",
    "KVG103": "the trend test over request ends: slope in bytes per request, p-value and confidence, the samples, "
              "the latest retained bytes and the trend line the HTML report draws",
    "KVG104": "reserved in the catalog: no detector raises it today (the paged pool reports shared blocks as "
              "KVG202 and KVG205)",
    "KVG105": "the retired generation and the current one, bytes, entries, owners, the declared reasons, and the "
              "holder chain; from a watched vLLM: the prefix blocks that survived a sleep/wake",
    "KVG106": "the sequence, the ranks that hold its KV and those that released it, bytes and storages by rank",
    "KVG107": "the cache or layer class and why the generic path was used",
    "KVG201": "the request, the block(s), the operation that freed them (`op #N release_blocks`); in vLLM the "
              "double frees so far",
    "KVG202": "the request, the block and slot written, the block's owner; from the Triton sanitizer the kernel, "
              "its source line, the program and sequence",
    "KVG203": "the block, its ref count and the live block tables (and deferred frees) that list it",
    "KVG204": "the request (its status, e.g. `FINISHED_ABORTED`) and the blocks its table still holds",
    "KVG205": "the block(s), the two namespaces (tenants or cache salts, as digests) and the requests",
    "KVG206": "the counts that do not add up: free, cached, referenced and total blocks (or SGLang's available, "
              "evictable, used and total tokens), and for how many scrapes",
    "KVG207": "the engine, KV usage, blocks and tokens held, and how long the server has run and queued nothing",
    "KVG208": "blocks in the index rebuilt from KV events against the cacheable blocks, or the prefixes split "
              "over many cache salts",
    "KVG209": "the missing sequence numbers, how many were recovered by replay and how many were lost",
    "KVG210": "the kernel and its source line, the program, sequence, block and slot read, and the block's owner",
    "KVG211": "the request, the slot and block read (with its offset), the operation and layer, and the tenant "
              "the block last belonged to",
    "KVG212": "the target, the sequential test's p-value and rounds, and the median times to first token of the "
              "repeated and the fresh prompt (and their ratio)",
    "KVG301": "the key pattern, cold keys and bytes, the idle-time distribution, the threshold and an example key",
    "KVG302": "the pattern and its placeholder positions (uuid, timestamp, date, hex, base64, random)",
    "KVG303": "the pattern, keys and bytes before and after, and the growth per hour",
    "KVG304": "the pattern, bytes per collection key before and after, and the largest keys in both scans",
    "KVG305": "the pattern, its keys and bytes, those without a TTL, and an example key",
    "KVG401": "the file, line and column of the decode loop and the cache variable fed back",
    "KVG402": "the file, line and column of the store and the module- or class-level container",
    "KVG403": "the file, line and column of the memo and what it takes or returns",
    "KVG404": "the file, line and column where the exception or traceback is kept",
    "KVG405": "the file, line and column of the Redis write and the timestamp or UUID in its key",
    "KVG406": "the file, line and column of the append and the list it grows",
    "KVG407": "the file, line and column where the map is filled, and the map",
}

#: Code that only reads findings (reports, exporters, reproductions): not where an id is raised.
_NOT_RAISERS = ("kvguardian/apps/", "kvguardian/core/report/", "kvguardian/core/exporters/", "kvguardian/core/findings.py")


def _anchor(prog: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", prog.lower()).strip("-")


def cli_page() -> str:
    """Every (sub)command's ``--help``, as the command prints it on a terminal 100 columns wide."""
    from kvguardian.apps.cli import COMMANDS, GROUPS, all_parsers

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parsers = list(all_parsers())  # built while COLUMNS is set: argparse reads it then
        helps = {p.prog: p.format_help() for _, p in parsers}
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    lines = [
        "# Command line",
        "",
        "Generated from the parsers themselves (`kvguardian.apps.cli.build_parser()`) when the site is built: "
        "each section is what `--help` prints. Every command exits `0` when no finding reaches `--fail-on`, "
        "`1` when one does, `2` for a usage error and `3` when something it needs is missing "
        "(see [Findings](findings.md#exit-codes)).",
        "",
        "| for | commands |",
        "|---|---|",
    ]
    for title, names in GROUPS.items():
        links = ", ".join(f"[`{name}`](#{_anchor('kv-guardian ' + name)})" for name in names)
        lines.append(f"| {title.removeprefix('for ')} | {links} |")
    assert sorted(n for names in GROUPS.values() for n in names) == sorted(COMMANDS)
    for depth, p in parsers:
        lines += ["", f"{'#' * (depth + 2)} `{p.prog}` {{#{_anchor(p.prog)}}}", "", "```text",
                  helps[p.prog].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _raisers() -> dict[str, list[str]]:
    """finding id -> the modules whose code (not docstrings) names it, outside the code that only reads findings."""
    found: dict[str, set[str]] = {}
    src = ROOT / "src"
    for path in sorted((src / "kvguardian").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(_NOT_RAISERS) or "_pb2" in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"KVG\d{3}",
                                                                                               node.value):
                module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                found.setdefault(node.value, set()).add(module)
    return {fid: sorted(modules) for fid, modules in found.items()}


def findings_page() -> str:
    """Every finding id: the summary table (`catalog_markdown`), then each id's meaning, evidence and fix."""
    from kvguardian.core.findings import CATALOG, catalog_markdown

    missing = sorted(set(CATALOG) ^ set(EVIDENCE))
    if missing:
        raise ValueError(f"docs/_hooks/reference.py EVIDENCE and CATALOG differ in: {', '.join(missing)}")
    raisers = _raisers()
    lines = [
        "# Findings",
        "",
        "Every finding kv-guardian reports carries one of these ids. Generated from "
        "`kvguardian.core.findings.CATALOG` when the site is built (`python -m kvguardian.core.findings` prints the table).",
        "",
        "Severity: `error` proven, `warning` suspected (with the statistic), `info` retained but bounded. A "
        "detector may lower an id's default severity (a bounded collection) or raise it (proof).",
        "",
        "## Exit codes",
        "",
        "Commands exit `0` when no finding reaches `--fail-on` (default `error`), `1` when one does, `2` for a "
        "usage error (one line: what, where, the fix), `3` when something the command needs is missing; `isolation "
        "cache-sharing` exits `4` when it cannot decide within its sample cap; `kv-guardian run` exits with the "
        "program's own code when that is not 0.",
        "",
        "## All ids",
        "",
        catalog_markdown(),
    ]
    for kind in CATALOG.values():
        where = ", ".join(f"`{m}`" for m in raisers.get(kind.id, [])) or "—"
        lines += [
            "",
            f"## {kind.id} {kind.name} {{#{kind.id.lower()}}}",
            "",
            f"- **Default severity**: {kind.severity.value}",
            f"- **Meaning**: {kind.meaning}",
            f"- **Evidence**: {EVIDENCE[kind.id]}",
            f"- **Fix**: {kind.fix}",
            f"- **Raised in**: {where}",
        ]
    return "\n".join(lines) + "\n"


def _rule_comments(text: str) -> dict[str, str]:
    """Rule name -> the comment lines just above its ``- alert:``/``- record:`` line in a rules file."""
    comments: dict[str, str] = {}
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        rule = re.match(r"-\s+(?:alert|record):\s*(\S+)", stripped)
        if rule:
            comments[rule.group(1)] = " ".join(block)
        block = []
    return comments


def _rules() -> list[tuple[str, dict[str, Any], str]]:
    """(file, rule, its comment) for every rule of every ``deploy/prometheus/*.yml``, in file order."""
    import yaml

    out = []
    for path in sorted((ROOT / "deploy" / "prometheus").glob("*.yml")):
        text = path.read_text(encoding="utf-8")
        comments = _rule_comments(text)
        for group in yaml.safe_load(text).get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("alert") or rule.get("record")
                out.append((path.relative_to(ROOT).as_posix(), rule, comments.get(name, "")))
    return out


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def metrics_page() -> str:
    """Every exported metric (`markdown_table`), then every recording rule and alert with its expression."""
    from kvguardian.core.exporters.catalog import METRICS, label_table, markdown_table

    owners = sorted({m.owner for m in METRICS}, key=[m.owner for m in METRICS].index)
    rules = _rules()
    lines = [
        "# Metrics and alerts",
        "",
        "Generated when the site is built from `kvguardian.core.exporters.catalog` (the one list every collector "
        "builds its families from; `python -m kvguardian.core.exporters.catalog` prints the table) and from the rule "
        "files in `deploy/prometheus/`.",
        "",
        "Names follow Prometheus conventions (prefix `kvguardian_`, base units, `_total` only on counters) and "
        "never carry request ids, tenants or key names as labels. *Exported by*: "
        + ", ".join(f"`{o}`" for o in owners)
        + " — `guard` is the ledger of a running program (in-process exporter or `kv-guardian exporter`), "
        "`pool` a paged block pool attached to it, `watch` `kv-guardian watch vllm|sglang --exporter-port`, "
        "`vllm` the in-process audit inside vLLM's engine core, `oom` the pre-OOM guard (in-process or "
        "`kv-guardian oom-guard`), `redis` `kv-guardian redis exporter`.",
        "",
        "## Metrics",
        "",
        markdown_table(),
        "",
        "## Labels",
        "",
        "Every label's bound: the most values it takes in one family of one exporter (with the defaults, where "
        "the configuration sets it). instance, job, pod, namespace, model and tenant are never exported: "
        "Prometheus adds them as target labels when it scrapes (fleets: [Fleets](../notes/fleet.md)).",
        "",
        label_table(),
        "",
        "## Recording rules and alerts",
        "",
        "Check and test them with promtool (the test suite runs both; every alert has a unit test that fires, "
        "one on a sawtooth that is not a leak and must stay silent, and one that resolves):",
        "",
        "```bash",
        "promtool check rules deploy/prometheus/kvguardian-rules.yml",
        "promtool test rules deploy/prometheus/tests/*.test.yml",
        "```",
        "",
        "| rule | kind | for | severity | what it says |",
        "|---|---|---|---|---|",
    ]
    for _, rule, comment in rules:
        name = str(rule.get("alert") or rule.get("record"))
        kind = "alert" if "alert" in rule else "recording rule"
        severity = (rule.get("labels") or {}).get("severity", "—")
        summary = (rule.get("annotations") or {}).get("summary") or comment
        lines.append(f"| [`{name}`](#{_anchor(name)}) | {kind} | {rule.get('for', '—')} | {severity} | "
                     f"{summary.replace('|', '/')} |")
    for path, rule, comment in rules:
        name = str(rule.get("alert") or rule.get("record"))
        lines += ["", f"### `{name}` {{#{_anchor(name)}}}", ""]
        if comment:
            lines += [comment, ""]
        lines += [f"In `{path}`" + (f", firing after {_code(str(rule['for']))}" if "for" in rule else "") + ":",
                  "", "```promql", str(rule["expr"]).rstrip(), "```"]
        description = (rule.get("annotations") or {}).get("description")
        if description:
            lines += ["", f"Description: {_code(' '.join(str(description).split()))}"]
    return "\n".join(lines) + "\n"


#: Generated page -> what writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/findings.md": findings_page,
    "reference/metrics.md": metrics_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the site (MkDocs hook)."""
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files
