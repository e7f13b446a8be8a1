"""Make ``kit/tiny-moe`` next to ``kit/tiny-llama`` in an HF hub cache: the same tokenizer, a
random-weight ``MixtralForCausalLM`` with 4 experts (2 per token). Runs inside kit's CPU image
(torch and transformers come with vLLM), offline. Usage: python3 make_tiny_moe.py HUB_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REVISION = "0" * 39 + "1"


def main() -> None:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    hub = Path(sys.argv[1])
    llama = next((hub / "models--kit--tiny-llama" / "snapshots").iterdir())
    repo = hub / "models--kit--tiny-moe"
    snap = repo / "snapshots" / REVISION
    if (snap / "model.safetensors").exists():
        print(snap)
        return
    snap.mkdir(parents=True, exist_ok=True)
    for item in llama.iterdir():  # tokenizer, chat template, generation config
        if item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, snap / item.name)
    base = json.loads((llama / "config.json").read_text())
    config = MixtralConfig(
        vocab_size=base["vocab_size"],
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=2048,
        bos_token_id=base["bos_token_id"],
        eos_token_id=base["eos_token_id"],
        pad_token_id=base["pad_token_id"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(1234)
    MixtralForCausalLM(config).to(torch.bfloat16).save_pretrained(snap, safe_serialization=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    print(snap)


if __name__ == "__main__":
    main()
