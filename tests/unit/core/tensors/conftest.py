"""What the holder-search tests share: an application module for the test (its globals are roots, as an
application's are), named by the test module's ``APP_MODULE``."""

import pytest

from kvg_testing import fake_module


@pytest.fixture
def app(request):
    with fake_module(request.module.APP_MODULE) as mod:
        yield mod
