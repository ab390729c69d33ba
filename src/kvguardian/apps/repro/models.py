"""Tiny random-weight models built offline (no download), shared by the reproductions and tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TINY", "TinySpec", "build_llama", "llama_config"]


@dataclass(frozen=True)
class TinySpec:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 128
    max_positions: int = 4096

    def describe(self) -> str:
        return (
            f"Llama, {self.layers} layers, hidden {self.hidden}, {self.heads} heads "
            f"({self.kv_heads} KV), random weights"
        )


TINY = TinySpec()
#: The configuration of the earlier §2.1 research (`grad_tracking.RESEARCH_MIB`, docs/design/repro.md).
GRAD_SPEC = TinySpec(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=512)
#: The "small" benchmark configuration (8 layers, hidden 512).
SMALL = TinySpec(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1024, vocab=512)


def llama_config(spec: TinySpec) -> Any:
    """The `LlamaConfig` of ``spec`` (also the text decoder of the tiny vision-language model)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
    )


def build_llama(spec: TinySpec = TINY, *, seed: int = 0) -> Any:
    """A `LlamaForCausalLM` with random weights, in eval mode, float32, on the CPU."""
    import torch
    from transformers import LlamaForCausalLM

    cfg = llama_config(spec)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model
