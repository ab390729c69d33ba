"""The corpus runs whole in CI (CI=true) or with KVG_CORPUS=all; otherwise only its fast subset."""

import os

import pytest

from kvg_testing import IN_CI

FULL = IN_CI or os.environ.get("KVG_CORPUS", "") == "all"


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="corpus program outside the fast subset; KVG_CORPUS=all (or CI=true) runs it")
    for item in items:
        if item.get_closest_marker("corpus_full"):
            item.add_marker(skip)
