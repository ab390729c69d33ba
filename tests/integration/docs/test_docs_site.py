"""The documentation site: ``mkdocs build --strict`` passes (a broken link or anchor, or a page missing from
the nav, fails it), the reference pages generated from the code list every command, finding id, metric and
alert, and README.md stays a short way in that links only to files that exist."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvg_testing import ROOT, docs_reference
from kvguardian.apps.cli import all_parsers as cli_parsers
from kvguardian.core.exporters.catalog import METRICS
from kvguardian.core.findings import CATALOG

MKDOCS = Path(sys.executable).with_name("mkdocs")
README_MAX_LINES = 200

pytestmark = pytest.mark.slow


def build(config_dir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    if not MKDOCS.exists():
        pytest.skip(f"{MKDOCS} is not installed (a dev dependency: ./scripts/setup.sh --dev)")
    return subprocess.run([str(MKDOCS), "build", "--strict", "-d", str(out)], cwd=config_dir, capture_output=True,
                          text=True, timeout=300, env={"PATH": f"{MKDOCS.parent}:/usr/bin:/bin",
                                                       "NO_MKDOCS_2_WARNING": "1", "HOME": str(out.parent)})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = build(ROOT, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def all_parsers() -> list[argparse.ArgumentParser]:
    return [p for _, p in cli_parsers()]


def anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def test_every_nav_page_and_every_page_is_built(site):
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts)
    for page in pages:
        html = site / (page.with_suffix("") / "index.html" if page.name != "index.md" else page.with_suffix(".html"))
        assert html.exists(), f"docs/{page} was not built"
    for generated in docs_reference().PAGES:
        assert (site / Path(generated).with_suffix("") / "index.html").exists(), generated
        assert not (ROOT / "docs" / generated).exists(), f"docs/{generated} is generated: do not commit it"


def test_cli_reference_has_every_command_and_its_help(site, monkeypatch):
    reference = docs_reference()
    page = reference.cli_page()
    html = (site / "reference" / "cli" / "index.html").read_text()
    monkeypatch.setenv("COLUMNS", reference.HELP_COLUMNS)  # the width the page was rendered at
    parsers = all_parsers()
    assert len(parsers) > 20
    for p in parsers:
        assert f'id="{anchor(p.prog)}"' in html, p.prog
        assert p.format_help().rstrip() in page, f"{p.prog}: its --help is not on the page as it prints it"


def test_findings_reference_has_every_id_with_meaning_evidence_and_fix(site):
    reference = docs_reference()
    page = reference.findings_page()
    html = (site / "reference" / "findings" / "index.html").read_text()
    assert set(reference.EVIDENCE) == set(CATALOG)
    for kind in CATALOG.values():
        assert f'id="{kind.id.lower()}"' in html, kind.id
        section = page.split(f"## {kind.id} {kind.name}", 1)[1].split("\n## ", 1)[0]
        assert kind.meaning in section and kind.fix in section and reference.EVIDENCE[kind.id] in section, kind.id


def test_metrics_reference_has_every_metric_and_every_rule(site):
    import yaml

    page = docs_reference().metrics_page()
    html = (site / "reference" / "metrics" / "index.html").read_text()
    for metric in METRICS:
        assert f"`{metric.name}`" in page and metric.name in html, metric.name
    rules = [rule.get("alert") or rule.get("record")
             for path in sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
             for group in yaml.safe_load(path.read_text()).get("groups", [])  # prometheus.yml has none
             for rule in group["rules"]]
    assert len(rules) > 10
    for name in rules:
        assert f'id="{anchor(name)}"' in html, name


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "deploy" / "prometheus", copy / "deploy" / "prometheus")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "getting-started.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    proc = build(copy, tmp_path / "site")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr


def test_readme_is_short_and_links_only_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "README.md is the way in: move details to docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links, "README.md links to the documentation"
    for link in links:
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        target = link.split("#", 1)[0]
        assert target and (ROOT / target).exists(), f"README.md links to {link}, which does not exist"
    for command in ("./scripts/demo.sh", "./scripts/test.sh", ".ci/run"):
        assert command in readme
