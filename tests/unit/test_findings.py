import json
import re

import pytest

from kvguardian.core.errors import EXIT_FINDINGS, EXIT_OK, UsageError
from kvguardian.core.findings import CATALOG, Finding, Report, Severity, catalog_markdown


def test_catalog_ids_are_stable_and_unique():
    assert all(re.fullmatch(r"KVG\d{3}", k) for k in CATALOG)
    names = [k.name for k in CATALOG.values()]
    assert len(names) == len(set(names))
    for required in ("KVG101", "KVG102", "KVG103", "KVG104", "KVG105", "KVG106"):
        assert required in CATALOG


def test_docs_reference_table_is_generated_from_catalog():
    from kvg_testing import docs_reference

    page = docs_reference().findings_page()  # reference/findings.md of the documentation site
    assert catalog_markdown() in page
    for kind in CATALOG.values():
        assert f"## {kind.id} {kind.name}" in page and kind.fix in page


def test_finding_defaults_from_catalog_and_unknown_id_is_refused():
    f = Finding("KVG102", "error", "msg", {"bytes": 3}, ["module a: X", "Tensor"])
    assert f.name == "orphaned-kv" and f.fix == CATALOG["KVG102"].fix
    assert f.severity is Severity.ERROR
    assert f.render_chain() == "module a: X → Tensor"
    with pytest.raises(UsageError, match="unknown finding id 'KVG999'"):
        Finding("KVG999", "error", "x")


def test_report_round_trip_and_exit_policy():
    r = Report([Finding("KVG103", Severity.WARNING, "grew", {"p_value": 1e-4})], summary={"entries": 1})
    again = Report.from_json(r.to_json())
    assert again.to_dict()["findings"] == r.to_dict()["findings"]
    assert json.loads(r.to_json())["counts"] == {"info": 0, "warning": 1, "error": 0}
    assert r.exit_code("error") == EXIT_OK
    assert r.exit_code("warning") == EXIT_FINDINGS
    assert r.exit_code(Severity.INFO) == EXIT_FINDINGS
    assert Report().exit_code("info") == EXIT_OK
    with pytest.raises(UsageError, match="unknown severity 'fatal'"):
        r.exit_code("fatal")
