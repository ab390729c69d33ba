"""A finding noticed inside ``generate()`` (under kv-guardian's wrappers and transformers' and torch's frames)
names the user's line: the ``KVGuardianWarning``'s filename and line number, and the finding's ``call_site``."""

import inspect
import warnings

import torch
from transformers import LlamaForCausalLM

from kvguardian.apps.repro.models import TINY, llama_config
from kvguardian.core.callsite import KVGuardianWarning
from kvguardian.runtime.guard import Guard
from kvguardian.runtime.hf.compat import output_cache


class TrainableWhileServing(LlamaForCausalLM):
    """A model whose forward turns autograd back on inside generate()'s no_grad: its KV carries a graph (KVG101)."""

    @torch.enable_grad()
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


def ids_of(n=7):
    return torch.randint(2, 100, (1, n), generator=torch.Generator().manual_seed(0))


def test_warning_and_findings_name_the_line_that_called_generate():
    torch.manual_seed(0)
    model = TrainableWhileServing(llama_config(TINY))
    model.generation_config.pad_token_id = 0
    g = Guard().attach(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = inspect.currentframe().f_lineno + 1
            out = model.generate(ids_of(), max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
        ours = [w for w in caught if issubclass(w.category, KVGuardianWarning)]
        assert ours and "KVG101" in str(ours[0].message)
        assert {(w.filename, w.lineno) for w in ours} == {(__file__, line)}
        report = g.check()
        site = f"{__file__}:{line} (test_warning_and_findings_name_the_line_that_called_generate)"
        [grad] = report.by_id("KVG101")
        assert grad.evidence["call_site"] == site
        [orphaned] = report.by_id("KVG102")  # `out` holds the request's cache
        assert orphaned.evidence["call_site"] == site
        assert output_cache(out) is not None
    finally:
        g.detach()


def test_a_request_block_is_recorded_where_it_began(tiny_model):
    g = Guard().attach(tiny_model)
    try:
        line = inspect.currentframe().f_lineno + 1
        with g.request("r1"):
            out = tiny_model.generate(ids_of(), max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
        [orphaned] = g.check().by_id("KVG102")
        assert orphaned.evidence["call_site"].startswith(f"{__file__}:{line} ")
        assert output_cache(out) is not None
    finally:
        g.detach()
