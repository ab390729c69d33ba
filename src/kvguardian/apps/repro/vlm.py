"""A tiny vision-language model with random weights, built offline: transformers' own LLaVA classes (a CLIP
vision tower and a projector producing visual tokens, prefixed to the tiny Llama decoder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.apps.repro.models import TinySpec, llama_config

if TYPE_CHECKING:
    import torch
    from transformers import LlavaForConditionalGeneration

__all__ = ["VLM_TINY", "VlmSpec", "build_vlm", "image_features"]


@dataclass(frozen=True)
class VlmSpec(TinySpec):
    """The tiny Llama decoder (`TinySpec`'s fields) plus a CLIP vision tower."""

    image_size: int = 64
    patch_size: int = 8  # visual tokens per image = (image_size / patch_size) ** 2
    vision_hidden: int = 32
    vision_layers: int = 1

    @property
    def visual_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def visual_kv_bytes(self, element_size: int = 4) -> int:
        """Bytes of one image's K and V over all decoder layers."""
        return 2 * self.layers * self.visual_tokens * self.kv_heads * self.head_dim * element_size

    def describe(self) -> str:
        return (
            f"LLaVA (transformers), CLIP tower {self.image_size}px/{self.patch_size}px patches → "
            f"{self.visual_tokens} visual tokens, Llama decoder {self.layers} layers, hidden {self.hidden}, "
            f"{self.heads} heads ({self.kv_heads} KV), random weights"
        )


VLM_TINY = VlmSpec()


def build_vlm(spec: VlmSpec = VLM_TINY, *, seed: int = 0) -> Any:
    """A `LlavaForConditionalGeneration` with random weights (same ``seed`` → same weights), eval, CPU."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=spec.vision_hidden, intermediate_size=2 * spec.vision_hidden,
        num_hidden_layers=spec.vision_layers, num_attention_heads=2,
        image_size=spec.image_size, patch_size=spec.patch_size,
    )
    cfg = LlavaConfig(vision_config=vision, text_config=llama_config(spec), image_token_index=spec.vocab - 1,
                      image_seq_length=spec.visual_tokens)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model


def image_features(model: LlavaForConditionalGeneration, pixel_values: torch.Tensor) -> Any:
    """Visual tokens of one image, ``[visual_tokens, hidden]`` (CLIP tower + projector, CLS dropped)."""
    out = model.get_image_features(pixel_values=pixel_values)
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, (list, tuple)):
        feats = feats[0]
    return feats.reshape(-1, feats.shape[-1])
