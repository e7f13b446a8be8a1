"""Generate kit's tiny offline chat model, ``kit/tiny-llama``, into an HF hub cache.

Runs inside kit's CPU image (torch, transformers and tokenizers come with vLLM) and
needs no network: a byte-level BPE tokenizer is trained on a few fixed sentences and
a random-weight ``LlamaForCausalLM`` (fixed seed) is saved next to it. The output is
an HF-cache-style tree, so that with ``HF_HUB_CACHE=<out>`` (or ``HF_HOME=<out>/..``
when ``<out>`` ends in ``hub``) and ``HF_HUB_OFFLINE=1``, ``vllm serve kit/tiny-llama``
resolves it offline::

    <out>/models--kit--tiny-llama/refs/main            -> REVISION
    <out>/models--kit--tiny-llama/snapshots/REVISION/  config.json, model.safetensors, ...

Sizes follow FIELD_NOTES section 7: hidden 256, 4 layers, 4 heads, 2 KV heads,
head_dim 64 (vLLM's CPU attention kernel rejects head_dim 16), bf16, about 5 MB.
Two runs with the same versions of torch/transformers/tokenizers give byte-identical
files. Usage: ``python3 make_tiny_model.py --out /hf-cache/hub``; prints the snapshot path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Never reach for the hub, even by accident (imports below read these at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO_ID = "kit/tiny-llama"
# Bump the suffix when the recipe changes, so cached copies are told apart.
REVISION = hashlib.sha1(b"kit/tiny-llama:recipe-1").hexdigest()
SEED = 1234

BOS, EOS, PAD = "<|begin_of_text|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

CORPUS = [
    "kit makes multi-node vLLM serving boring.",
    "Hello! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "Tensor parallel splits each layer across devices; pipeline parallel splits layers.",
    "Ray forms a cluster: one head node and several worker nodes.",
    "What is the capital of France? The capital of France is Paris.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "user assistant system: a short chat between a person and a model.",
]


def build_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def build_model(vocab_size: int, bos_id: int, eos_id: int, pad_id: int):  # -> LlamaForCausalLM
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.do_sample = False
    return model


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def generate(out: Path) -> Path:
    repo_dir = out / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / REVISION
    # Write into a temporary sibling, then swap in: a half-written snapshot is never visible.
    repo_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=repo_dir))
    try:
        tokenizer = build_tokenizer(vocab_size=512)
        model = build_model(
            vocab_size=len(tokenizer),
            bos_id=tokenizer.bos_token_id,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
        )
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
        for p in tmp.rglob("*"):
            if p.is_file():
                p.chmod(0o644)
        if snapshot.exists():
            shutil.rmtree(snapshot)
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)
        tmp.rename(snapshot)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REVISION)
    return snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="HF hub cache dir, e.g. /hf-cache/hub")
    parser.add_argument("--digests", action="store_true", help="also print sha256 of every file (stderr)")
    args = parser.parse_args(argv)
    snapshot = generate(args.out)
    if args.digests:
        for name, digest in file_digests(snapshot).items():
            print(f"{digest}  {name}", file=sys.stderr)
    print(snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
