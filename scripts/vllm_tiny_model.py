"""Build the tiny random-weight Llama and its byte-level BPE tokenizer that the real-vLLM tests serve.

    .venv-vllm/bin/python scripts/vllm_tiny_model.py OUT_DIR

Offline (no download): the tokenizer is trained here on generated text, the weights are random (seeded).
vLLM on CPU refuses head_dim 16, so the model has 2 layers, hidden 128, 2 heads of 64; vocab 2048.
Idempotent: an OUT_DIR holding a complete model (``kvg-model.json`` written last) is left alone.
"""

from __future__ import annotations

import json
import random
import string
import sys
from pathlib import Path

CONFIG = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
          "intermediate_size": 256, "num_hidden_layers": 2, "vocab_size": 2048, "max_position_embeddings": 4096,
          "bos_token_id": 1, "eos_token_id": 2}
MARK = "kvg-model.json"


def _corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(32)) for _ in range(lines)]


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(1234)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=CONFIG["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(rng), trainer)
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(out))
    torch.manual_seed(1234)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, torch_dtype="bfloat16")).to(torch.bfloat16)
    model.save_pretrained(str(out))
    (out / MARK).write_text(json.dumps({"config": CONFIG, "tokenizer_vocab": tok.get_vocab_size()}))


def main() -> int:
    if len(sys.argv) != 2:
        sys.stderr.write("usage: vllm_tiny_model.py OUT_DIR\n")
        return 2
    out = Path(sys.argv[1])
    if (out / MARK).is_file():
        return 0
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
