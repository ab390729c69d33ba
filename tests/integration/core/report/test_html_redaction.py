"""Redaction and privacy hold in the HTML report, for a real Guard on a real (tiny, random-weight) model: planted
canary strings - in the prompt's text, in the dictionary key that keeps a leaked cache, in KV tensor values - are
never in the page (nor in the memory snapshot or the trace) when they must not be."""

from __future__ import annotations

import json

import pytest

from kvguardian.apps.cli import main

PROMPT_CANARY = "zebracanaryprompt"
KEY_CANARY = "canary-key-5b1e9d"
VALUE_CANARY = 12345.6789


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "hello", "world", PROMPT_CANARY, "tell", "me"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def _leaky_run(tiny_model, *, redact: bool):
    import torch

    import kvguardian as kvg

    guard = kvg.Guard(redact=redact)
    guard.attach(tiny_model)
    sessions = {}
    ids = _tokenizer()(f"hello {PROMPT_CANARY} tell me", return_tensors="pt").input_ids
    try:
        with guard.request("r-canary", tenant="t1"):
            out = tiny_model.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
        sessions[KEY_CANARY] = out.past_key_values
        k = torch.full((1, 2, 4, 16), VALUE_CANARY)
        with guard.request("r-tracked"):
            guard.track(k, k.clone(), layer=0)
        sessions[KEY_CANARY + "-tracked"] = k
        del out, k  # the dict is what keeps them: its keys are in the holder chains
        return guard.check(), sessions
    finally:
        guard.detach()


def _outputs(tmp_path, report, *extra):
    src = tmp_path / "kv.json"
    src.write_text(report.to_json())
    html = tmp_path / "kv.html"
    assert main(["report", str(src), "-o", str(html), *extra]) == 0
    return src.read_text(), html.read_text()


@pytest.mark.parametrize("redact", [False, True])
def test_canaries_in_html(tmp_path, tiny_model, redact):
    report, sessions = _leaky_run(tiny_model, redact=redact)
    assert report.by_id("KVG102")  # the leak is there to be shown
    body, html = _outputs(tmp_path, report)
    for doc in (body, html):
        assert PROMPT_CANARY not in doc
        assert str(VALUE_CANARY) not in doc and "12345.67" not in doc
        assert (KEY_CANARY in doc) is (not redact)  # shown by default (the test can fail), hidden when redacted
    assert "r-canary" in html  # the request is still named
    del sessions


def test_report_redact_hides_what_guard_redact_hides(tmp_path, tiny_model):
    report, sessions = _leaky_run(tiny_model, redact=False)
    _, html = _outputs(tmp_path, report, "--redact")
    assert KEY_CANARY not in html
    assert f"dict[&lt;str len={len(KEY_CANARY)}&gt;]" in html  # as Guard(redact=True) writes the step
    guarded, _ = _leaky_run(tiny_model, redact=True)
    chains = {tuple(f.holder_chain or ()) for f in guarded.by_id("KVG102")}
    assert any(f"dict[<str len={len(KEY_CANARY)}>]" in step for chain in chains for step in chain)
    del sessions
    json.loads(report.to_json())
