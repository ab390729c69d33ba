"""Tiny random-weight models built offline (no download), shared by the reproductions and tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DRAFT",
    "TINY",
    "TinySpec",
    "build_bart",
    "build_hybrid",
    "build_llama",
    "build_sliding",
    "build_t5",
    "llama_config",
]


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
#: The smallest shape of the other cache layouts' models below (and of a speculative pair: one vocabulary).
DRAFT = TinySpec(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=64, max_positions=512)


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


def _ready(model: Any) -> Any:
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def build_t5(*, seed: int = 0) -> Any:
    """A tiny T5 encoder-decoder (its cache an ``EncoderDecoderCache``: self- and cross-attention KV)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=DRAFT.vocab, d_model=DRAFT.hidden, d_kv=8, d_ff=DRAFT.intermediate, num_layers=2,
                   num_decoder_layers=2, num_heads=DRAFT.heads, pad_token_id=0, eos_token_id=1)
    cfg.decoder_start_token_id = 0  # generate() starts the decoder there (a keyword T5Config takes only untyped)
    torch.manual_seed(seed)
    return _ready(T5ForConditionalGeneration(cfg))


def build_bart(*, seed: int = 0) -> Any:
    """A tiny BART encoder-decoder (its cache an ``EncoderDecoderCache``)."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=DRAFT.vocab, d_model=DRAFT.hidden, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=DRAFT.heads, decoder_attention_heads=DRAFT.heads,
                     encoder_ffn_dim=DRAFT.intermediate, decoder_ffn_dim=DRAFT.intermediate,
                     max_position_embeddings=128, pad_token_id=0, bos_token_id=0, eos_token_id=1,
                     decoder_start_token_id=0)
    torch.manual_seed(seed)
    return _ready(BartForConditionalGeneration(cfg))


def build_sliding(window: int = 4, *, seed: int = 0) -> Any:
    """A tiny Mistral with ``sliding_window``: every layer of its dynamic cache a sliding-window layer."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=DRAFT.vocab, hidden_size=DRAFT.hidden, intermediate_size=DRAFT.intermediate,
                        num_hidden_layers=2, num_attention_heads=DRAFT.heads, num_key_value_heads=DRAFT.kv_heads,
                        sliding_window=window, pad_token_id=0)
    torch.manual_seed(seed)
    return _ready(MistralForCausalLM(cfg))


def build_hybrid(window: int = 4, *, seed: int = 0) -> Any:
    """A tiny Gemma2 whose ``layer_types`` mix a sliding-window and a full-attention layer in one cache."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=DRAFT.vocab, hidden_size=DRAFT.hidden, intermediate_size=DRAFT.intermediate,
                       num_hidden_layers=2, num_attention_heads=DRAFT.heads, num_key_value_heads=DRAFT.kv_heads,
                       head_dim=8, sliding_window=window, layer_types=["sliding_attention", "full_attention"],
                       pad_token_id=0)
    torch.manual_seed(seed)
    return _ready(Gemma2ForCausalLM(cfg))
