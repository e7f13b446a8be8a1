"""Bounds on the numbers sizing reads from a model's config.json, checked before anything is sized.

A config.json is input like any other (issue 16): `num_hidden_layers` 1e12 made `kit plan` loop
for ever, 1e26 (a float) or 1e400 (inf once parsed) overflowed, a string or a list where a number
belongs raised a TypeError, zero heads divided by zero. Every number the parser reads is checked
here first: an integer (an integral float such as 4096.0 is accepted), finite, inside its range.
A refusal names the file and the key and says what range kit accepts (exit 3).

The upper bounds sit far above every released model and low enough that sizing stays fast:
`recommend()` tries every node count up to one pipeline stage per layer and walks the layers for
each (quadratic in the layer count), so layers are capped at 1,024 (the deepest released decoders
have about 130) to keep a `kit plan` that fits nowhere under about two seconds. The others only
enter arithmetic on Python integers and are capped to catch nonsense, not to save time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kit.errors import ConfigError

MAX_LAYERS = 1_024  # decoder layers; deepest released decoders ~130 (Llama-3.1-405B: 126)
MAX_HIDDEN = 1 << 20  # hidden sizes; largest released ~25k
MAX_HEADS = 1 << 16  # attention / KV / linear-attention heads and head sizes
MAX_INTERMEDIATE = 1 << 24  # MLP / expert widths; largest released ~100k
MAX_VOCAB = 10_000_000  # largest released ~260k (Gemma 3)
MAX_EXPERTS = 100_000  # routed experts; largest released 512
MAX_POSITIONS = 1 << 30  # context length; largest released ~10M (Llama-4-Scout)
MAX_MTP = 64  # multi-token-prediction layers; released: 1

# (lowest, highest) per key of the language model's config (the merged text_config).
TEXT_LIMITS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), (1, MAX_HIDDEN)),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), (1, MAX_LAYERS)),
    **dict.fromkeys(("vocab_size", "padded_vocab_size"), (1, MAX_VOCAB)),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads"), (1, MAX_HEADS)),
    "head_dim": (1, MAX_HEADS),
    # 0 means "not set" for these: the parser falls back to its default (4 × hidden, no shared expert).
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_hidden_size",
            "n_inner",
            "intermediate_size_mlp",
            "moe_intermediate_size",
            "expert_intermediate_size",
            "shared_expert_intermediate_size",
        ),
        (0, MAX_INTERMEDIATE),
    ),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "seq_length"), (1, MAX_POSITIONS)),
    "sliding_window": (0, MAX_POSITIONS),
    "attention_chunk_size": (0, MAX_POSITIONS),
    **dict.fromkeys(("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"), (0, MAX_EXPERTS)),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "n_shared_experts"), (0, MAX_EXPERTS)),
    **dict.fromkeys(
        (
            "first_k_dense_replace",
            "decoder_sparse_step",
            "moe_layer_freq",
            "interleave_moe_layer_step",
            "full_attention_interval",
            "sliding_window_pattern",
            "max_window_layers",
        ),
        (0, MAX_LAYERS),
    ),
    **dict.fromkeys(
        ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), (0, MAX_HIDDEN)
    ),
    **dict.fromkeys(
        ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"),
        (1, MAX_HEADS),
    ),
    "linear_conv_kernel_dim": (1, 1_024),
    **dict.fromkeys(("num_nextn_predict_layers", "mtp_num_hidden_layers"), (0, MAX_MTP)),
}

# Keys whose value is a list of layer indices.
LAYER_LISTS = ("mlp_only_layers", "moe_layers")

# vision_config (a ViT-style tower).
VISION_LIMITS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "depth", "num_layers", "vt_num_hidden_layers"), (0, MAX_LAYERS)),
    **dict.fromkeys(("hidden_size", "embed_dim", "width", "out_hidden_size", "vt_hidden_size"), (1, MAX_HIDDEN)),
    **dict.fromkeys(("projector_input_dim", "projector_output_dim", "vision_output_dim"), (1, MAX_HIDDEN)),
    **dict.fromkeys(("intermediate_size", "mlp_dim", "vt_intermediate_size"), (1, MAX_INTERMEDIATE)),
    "patch_size": (1, 4_096),
    "image_size": (1, 1 << 20),  # some configs give [height, width]: only a number is checked
    **dict.fromkeys(("num_channels", "in_channels", "in_chans", "temporal_patch_size"), (1, 1_024)),
    "spatial_merge_size": (1, 64),
    "num_position_embeddings": (0, MAX_POSITIONS),
}

# quantization_config and the blocks nested in it (compressed-tensors weights, Quark, ModelOpt).
QUANT_LIMITS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("bits", "w_bit", "num_bits"), (0, 32)),
    # -1 (or 0) means one group per input row; the rest are group widths.
    **dict.fromkeys(("group_size", "q_group_size", "bnb_4bit_blocksize"), (-1, MAX_INTERMEDIATE)),
}
BLOCK_KEYS = ("weight_block_size", "block_structure")  # [out, in] tile of block-wise scales
NAME_LISTS = (
    "modules_to_not_convert",
    "ignored_layers",
    "ignore",
    "llm_int8_skip_modules",
    "exclude_modules",
    "exclude",
)


def checked_int(value: Any, key: str, low: int, high: int, *, source: str) -> int:
    """`value` as an int in [low, high], or a ConfigError naming the key and the range."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None:
        raise ConfigError(
            f"{value!r} is not an integer",
            key=key,
            source=source,
            hint=f"use a whole number from {low} to {high:,}; kit plan reads a model's own config.json",
        )
    if not low <= number <= high:
        raise ConfigError(
            f"{_short(value)} is outside {low}..{high:,}",
            key=key,
            source=source,
            hint=f"use a whole number from {low} to {high:,}; kit plan reads a model's own config.json",
        )
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_numbers(
    cfg: Mapping[str, Any], limits: Mapping[str, tuple[int, int]], *, source: str, prefix: str = ""
) -> None:
    """Every key of `limits` that `cfg` sets (not null) must be an integer inside its range."""
    for key, (low, high) in limits.items():
        value = cfg.get(key)
        if value is None or (key == "image_size" and not isinstance(value, (int, float))):
            continue
        checked_int(value, prefix + key, low, high, source=source)


def check_text_config(cfg: Mapping[str, Any], *, source: str) -> None:
    """The language model's numbers, its layer lists and layer_types."""
    check_numbers(cfg, TEXT_LIMITS, source=source)
    for key in LAYER_LISTS:
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise ConfigError(
                f"{_short(value)} is not a list", key=key, source=source, hint="give a list of layer numbers"
            )
        for item in value:
            checked_int(item, key, 0, MAX_LAYERS - 1, source=source)
    types = cfg.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise ConfigError(
            f"{_short(types)} is not a list", key="layer_types", source=source, hint="give one type per layer"
        )
    vision = cfg.get("vision_config")
    if isinstance(vision, Mapping):
        check_numbers(vision, VISION_LIMITS, source=source, prefix="vision_config.")


def check_quant_config(quant: Any, *, source: str, key: str = "quantization_config") -> None:
    """A quantization block (and the blocks nested in it): numbers, block sizes, module lists."""
    if quant is None:
        return
    if not isinstance(quant, Mapping):
        raise ConfigError(f"{_short(quant)} is not an object", key=key, source=source, hint="fix config.json")
    check_numbers(quant, QUANT_LIMITS, source=source, prefix=f"{key}.")
    for name in BLOCK_KEYS:
        block = quant.get(name)
        if block is None:
            continue
        if not isinstance(block, list) or len(block) != 2:
            raise ConfigError(
                f"{_short(block)} is not [rows, columns]", key=f"{key}.{name}", source=source, hint="e.g. [128, 128]"
            )
        for item in block:
            checked_int(item, f"{key}.{name}", 1, MAX_INTERMEDIATE, source=source)
    for name in NAME_LISTS:
        names = quant.get(name)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ConfigError(
                f"{_short(names)} is not a list of module names",
                key=f"{key}.{name}",
                source=source,
                hint='e.g. ["lm_head"]',
            )
    # The schemes nested inside: ModelOpt's "quantization", compressed-tensors' config_groups,
    # Quark's global_quant_config (its weight may be one scheme or a list of them).
    if quant.get("quantization") is not None:
        check_quant_config(quant["quantization"], source=source, key=f"{key}.quantization")
    groups = quant.get("config_groups")
    if groups is not None:
        if not isinstance(groups, Mapping):
            raise ConfigError("is not an object", key=f"{key}.config_groups", source=source, hint="fix config.json")
        for name, group in groups.items():
            if isinstance(group, Mapping) and group.get("weights") is not None:
                check_quant_config(group["weights"], source=source, key=f"{key}.config_groups.{name}.weights")
    glob = quant.get("global_quant_config")
    if isinstance(glob, Mapping):
        weights = glob.get("weight")
        for scheme in weights if isinstance(weights, list) else [weights]:
            if scheme is not None:
                check_quant_config(scheme, source=source, key=f"{key}.global_quant_config.weight")
