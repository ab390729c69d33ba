"""The pytest plugin, tested with pytester: the kv_no_leak marker, the kv_guard fixture, options and ini."""

import pytest
import torch  # noqa: F401  - imported before the inline runs, which restore sys.modules after each run
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

import kvguardian.apps.repro.models
import kvguardian.runtime.guard  # noqa: F401

pytest_plugins = ["pytester"]

LEAKY = '''
import pytest, torch
from kvguardian.apps.repro.models import TINY, build_llama

MODEL = build_llama(TINY)
KEPT = {}

def chat(i):
    out = MODEL.generate(torch.ones(1, 5 + i, dtype=torch.long), max_new_tokens=2, do_sample=False,
                         return_dict_in_generate=True)
    return out.past_key_values

@pytest.mark.kv_no_leak
def test_leaks():
    for i in range(2):
        KEPT[f"s{i}"] = chat(i)

@pytest.mark.kv_no_leak
def test_clean():
    chat(0)

def test_unmarked_leak_is_not_checked():
    KEPT["x"] = chat(3)

def test_fixture(kv_guard):
    kv_guard.attach(MODEL)
    with kv_guard.request("r1", tenant="t"):
        MODEL.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=2, do_sample=False)
    assert kv_guard.snapshot().requests["r1"].tenant == "t"

@pytest.mark.kv_no_leak(fail_on="error")
def test_single_variable_is_bounded():
    global LAST
    LAST = chat(1)
'''


def test_marker_fails_a_leaking_test_with_id_bytes_and_chain(pytester):
    pytester.makepyfile(test_app=LEAKY)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-q")
    result.assert_outcomes(passed=4, failed=1)
    text = result.stdout.str()
    assert "kv_no_leak: 2 finding(s) at or above 'info'" in text
    assert "KVG102 orphaned-kv (error)" in text and " bytes: " in text
    assert "held by: module test_app: KEPT → dict['s0'] → DynamicCache.layers → list[0]" in text


def test_options_and_ini_twins(pytester):
    pytester.makepyfile(test_app=LEAKY)
    pytester.makeini("[pytest]\nkv_no_leak_all = true\nkv_fail_on = error\n")
    result = pytester.runpytest_inprocess("-q", "--kv-report", "kv.jsonl")
    # every test is checked now; with fail_on=error the unmarked test's single kept cache is reported as
    # bounded retention (info) and passes, while two requests' KV in one dict is an error
    result.assert_outcomes(passed=4, failed=1)
    import json

    rows = [json.loads(line) for line in (pytester.path / "kv.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    unmarked = next(r for r in rows if r["test"].endswith("test_unmarked_leak_is_not_checked"))
    assert [(f["id"], f["severity"]) for f in unmarked["findings"]] == [("KVG102", "info")]
    result = pytester.runpytest_inprocess("-q", "--kv-fail-on", "warning", "-k", "single_variable")
    result.assert_outcomes(passed=1)


def test_bad_marker_arguments_are_a_usage_error(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.kv_no_leak(budget=3)\ndef test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("-q")
    assert "kv_no_leak on test_bad_marker_arguments_are_a_usage_error.py::test_x got unknown arguments " \
        "['budget']" in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(("args", "says"), [
    ('fail_on="bogus"', "fail_on: unknown severity 'bogus'"),
    ("allow_bytes=-5", "allow_bytes=-5 must be a whole number of bytes >= 0"),
    ('allow_bytes="lots"', "allow_bytes='lots' must be a whole number"),
    ("allow_bytes=1.5", "allow_bytes=1.5 must be a whole number"),
    ('"error"', "takes keywords only, got ('error',)"),
])
def test_a_bad_marker_value_fails_that_test_with_one_line(pytester, args, says):
    """A marker's value was a traceback into kv-guardian (ValueError from int('lots'), UsageError from the
    severity parser) or silently accepted (allow_bytes=-5, a positional argument)."""
    pytester.makepyfile(f"import pytest\n@pytest.mark.kv_no_leak({args})\ndef test_x():\n    pass\n"
                        "def test_y():\n    pass\n")
    result = pytester.runpytest_inprocess("-q", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert says in out and "@pytest.mark.kv_no_leak on " in out
    assert "Traceback" not in out and "kvguardian/" not in out and "pytest_plugin.py" not in out


def test_a_bad_kv_fail_on_ini_value_is_a_usage_error_not_an_internal_error(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.makeini("[pytest]\nkv_fail_on = bogus\n")
    result = pytester.runpytest_subprocess("-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "kv_fail_on: unknown severity 'bogus'" in err and "INTERNALERROR" not in err


@pytest.mark.parametrize("value", ["soon"])
def test_bad_ini_value(pytester, value):
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.makeini(f"[pytest]\nkv_holder_seconds = {value}\n")
    result = pytester.runpytest_inprocess("-q")
    assert "kv_holder_seconds must be a number of seconds" in result.stderr.str() + result.stdout.str()


def test_an_unwritable_kv_report_is_one_usage_error_at_session_start(pytester):
    """Issue 13 item 11: `--kv-report /no/such/dir/r.jsonl` failed every kv_no_leak test with a raw
    FileNotFoundError; now the session refuses to start, with one line naming the option."""
    pytester.makepyfile("import pytest\n@pytest.mark.kv_no_leak\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-q", "--kv-report", str(pytester.path / "no" / "such" / "r.jsonl"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--kv-report" in err and "folder that does not exist" in err
    assert "FileNotFoundError" not in err + result.stdout.str() and "passed" not in result.stdout.str()
