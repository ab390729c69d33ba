"""The browser tests' helper: without Debian's chromium (or Playwright) it skips locally and fails in CI."""

from __future__ import annotations

import pytest

import kvg_browser


@pytest.mark.parametrize(("in_ci", "outcome"), [(True, pytest.fail.Exception), (False, pytest.skip.Exception)])
def test_a_missing_chromium_fails_in_ci_and_skips_locally(monkeypatch, tmp_path, in_ci, outcome):
    monkeypatch.setattr(kvg_browser, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setattr(kvg_browser, "IN_CI", in_ci)
    with pytest.raises(outcome, match=r"is not installed; run \./scripts/setup\.sh"), kvg_browser.chromium():
        pass
